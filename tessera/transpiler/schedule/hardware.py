"""What each target architecture offers a kernel, as data.

Numbers are the vendors' published limits (CUDA C Programming Guide,
compute-capability tables; AMD CDNA2/CDNA3 ISA guides). The CPU entries are
assumptions, because output must not depend on the machine that compiles
it: a program is one thread, and the SIMD width is the one the arch names
(``native`` assumes AVX2; the generated C++ adapts at build time).
"""

from __future__ import annotations

from ...frozen import frozen

__all__ = ["Hardware", "covers", "hardware_for", "instruction", "KIB", "GRID_COLUMNS"]

KIB = 1024


#: Threads along a Grid tile's columns in the SIMT backends: a half warp reads 16
#: neighbouring elements. A row vector of such a tile is combined across them through
#: a shared array of GRID_COLUMNS floats per row, which the schedule must count.
GRID_COLUMNS = 16


@frozen
class Hardware:
    target: str
    arch: str
    kind: str  # "gpu" or "cpu"
    #: Threads per warp or wavefront; on CPUs, f32 lanes of one SIMD register.
    lanes: int
    #: Threads per program (block, work-group); 1 on CPUs.
    max_threads: int
    #: Shared memory (LDS, local memory) one program may use; on CPUs, the L2 share
    #: a program's working set should fit.
    smem_bytes: int
    #: 32-bit registers one thread may hold.
    regs_per_thread: int
    #: SMs, CUs or cores; 0 when unknown (no wave quantization).
    units: int
    #: The matrix instruction a dot lowers to on this arch.
    mma: str
    #: Multiples that tile sizes must respect for that instruction.
    mma_m: int
    mma_n: int
    #: Widest single load per thread, in bytes.
    vector_bytes: int
    #: Whether copies to shared memory can run ahead of compute (cp.async, TMA, LDS
    #: prefetch); without it, pipeline stages do not multiply shared memory.
    async_copy: bool = True


_TABLE = {
    ("cuda", "sm_80"): Hardware(
        "cuda", "sm_80", "gpu", 32, 1024, 163 * KIB, 255, 108, "mma.sync.m16n8k16", 16, 8, 16
    ),
    ("cuda", "sm_90a"): Hardware(
        "cuda", "sm_90a", "gpu", 32, 1024, 227 * KIB, 255, 132, "wgmma.m64nNk16", 64, 8, 16
    ),
    ("hip", "gfx90a"): Hardware(
        "hip", "gfx90a", "gpu", 64, 1024, 64 * KIB, 512, 110, "mfma.f32.32x32x8bf16", 32, 32, 16
    ),
    ("hip", "gfx942"): Hardware(
        "hip", "gfx942", "gpu", 64, 1024, 64 * KIB, 512, 304, "mfma.f32.32x32x8bf16", 32, 32, 16
    ),
    # 64 KiB of local memory, as on AMD, Intel and PoCL; NVIDIA's OpenCL has 48 KiB,
    # which the OpenCL runtime checks when it loads a kernel.
    ("opencl", "generic"): Hardware(
        "opencl", "generic", "gpu", 32, 256, 64 * KIB, 128, 0, "simt", 1, 1, 16, False
    ),
    # SYCL assumes no more of a device than OpenCL does (no matrix extension).
    ("sycl", "generic"): Hardware(
        "sycl", "generic", "gpu", 32, 256, 64 * KIB, 128, 0, "simt", 1, 1, 16, False
    ),
    ("cpu", "native"): Hardware(
        "cpu", "native", "cpu", 8, 1, 1024 * KIB, 0, 0, "simd", 1, 8, 32, False
    ),
    ("cpu", "x86-64-v2"): Hardware(
        "cpu", "x86-64-v2", "cpu", 4, 1, 1024 * KIB, 0, 0, "simd", 1, 4, 16, False
    ),
    ("cpu", "x86-64-v3"): Hardware(
        "cpu", "x86-64-v3", "cpu", 8, 1, 1024 * KIB, 0, 0, "simd", 1, 8, 32, False
    ),
    ("cpu", "x86-64-v4"): Hardware(
        "cpu", "x86-64-v4", "cpu", 16, 1, 1024 * KIB, 0, 0, "simd", 1, 16, 64, False
    ),
    ("cpu", "armv8-a"): Hardware(
        "cpu", "armv8-a", "cpu", 4, 1, 1024 * KIB, 0, 0, "simd", 1, 4, 16, False
    ),
}


def hardware_for(target: str, arch: str) -> Hardware:
    return _TABLE[(target, arch)]


# (target, arch or "*", operand dtype) -> (instruction, (m, n, k))
INSTRUCTIONS: dict[tuple[str, str, str], tuple[str, tuple[int, int, int]]] = {
    ("cuda", "sm_80", "bf16"): ("mma.sync.bf16", (16, 8, 16)),
    ("cuda", "sm_80", "f16"): ("mma.sync.f16", (16, 8, 16)),
    ("cuda", "sm_80", "tf32"): ("mma.sync.tf32", (16, 8, 8)),
    # sm_80 has no fp8 mma: the fragments are widened to f16 in registers.
    ("cuda", "sm_80", "fp8_e4m3"): ("mma.sync.f16", (16, 8, 16)),
    ("cuda", "sm_80", "fp8_e5m2"): ("mma.sync.f16", (16, 8, 16)),
    ("cuda", "sm_90a", "bf16"): ("wgmma.bf16", (64, 0, 16)),
    ("cuda", "sm_90a", "f16"): ("wgmma.f16", (64, 0, 16)),
    # wgmma takes tf32 operands K-major only, and reads them from shared memory as
    # they lie there, not rounded to tf32 as the tensors' reads must be: tf32 runs on
    # mma.sync, whose fragments are rounded as they are loaded.
    ("cuda", "sm_90a", "tf32"): ("mma.sync.tf32", (16, 8, 8)),
    # fp8 runs on wgmma (k32) where both operands are K-major (see _K_MAJOR_ONLY).
    ("cuda", "sm_90a", "fp8_e4m3"): ("wgmma.fp8_e4m3", (64, 0, 32)),
    ("cuda", "sm_90a", "fp8_e5m2"): ("wgmma.fp8_e5m2", (64, 0, 32)),
    ("hip", "*", "bf16"): ("mfma_f32_32x32x8bf16_1k", (32, 32, 8)),
    ("hip", "*", "f16"): ("mfma_f32_32x32x8f16", (32, 32, 8)),
    ("hip", "*", "f32"): ("mfma_f32_32x32x2f32", (32, 32, 2)),
    ("hip", "*", "tf32"): ("mfma_f32_32x32x2f32", (32, 32, 2)),  # tf32 values are f32s
    ("hip", "gfx942", "fp8_e4m3"): ("mfma_f32_32x32x16_fp8_fp8", (32, 32, 16)),
}


def instruction(hw: Hardware, dtype: str, n_tile: int) -> tuple[str, tuple[int, int, int], str]:
    """The matrix instruction for a dot of ``dtype`` operands (FMA where there is none), and
    where it reads its operands. A GPU product reads them from shared memory as it runs:
    ``wgmma`` through descriptors, ``mma.sync`` and MFMA a k step of fragments at a time,
    the FMA loop each thread the elements it multiplies. The CPU's micro-kernel reads
    packed registers."""
    if hw.kind == "cpu":
        return "simd.fma", (4, 2 * hw.lanes, 1), "registers"
    for key in ((hw.target, hw.arch, dtype), (hw.target, "*", dtype)):
        if key in INSTRUCTIONS:
            inst, (m, n, k) = INSTRUCTIONS[key]
            return inst, (m, n or n_tile, k), "shared"
    return "fma", (1, 1, 1), "shared"


def covers(shape: tuple[int, ...], rows: int, cols: int, warps: tuple[int, int] = (1, 1)) -> bool:
    """Whether a matrix instruction's ``m x n`` tiles cover a ``rows x cols`` tile split
    over ``warps`` (rows x cols of warps): each warp's part a whole number of them. The
    schedule asks it of a block (one warp's view: the block must be made of whole tiles)
    and legalization of the warp layout it chose; where it fails, the product runs as
    an FMA loop (or the schedule is refused), so both must ask the same question."""
    m, n = shape[0], shape[1]
    wm, wn = warps
    return rows % (wm * m) == 0 and cols % (wn * n) == 0
