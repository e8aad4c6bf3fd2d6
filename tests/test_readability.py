"""Generated files read as code a reviewer would accept: measured over the golden files.

The goldens are the generated output of every example (``test_golden.py`` keeps them
equal), so that these measures cost no compile. They cover every target's output.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.transpiler.target.header import paragraphs, split
from tessera.transpiler.target.index_names import with_named_indices
from tessera.transpiler.target.single_iteration import without_single_iterations

from .conftest import ROOT

GOLDEN = ROOT / "golden"
#: The generated files whose every line is measured.
WRAPPED = sorted(
    p
    for suffix in (
        "cpu-native.cpp",
        "opencl-generic.cl",
        "sycl-generic.sycl.cpp",
        "cuda-*.cu",
        "hip-*.hip",
    )
    for p in GOLDEN.glob(f"*/target.{suffix}")
)
EVERY = sorted(GOLDEN.glob("*/target.*"))
#: Where the tile-primitives header inlined into a file ends, by target.
_HEADER_END = re.compile(r"^(?:}  // namespace tsr|// end of the Tessera tile primitives)$", re.M)
#: Integers that a kernel may write again and again (indices, small factors).
_SMALL = 16


def _ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}-{p.name.split('.')[1]}" for p in paths]


def _body(text: str) -> str:
    """The file after the provenance stamp (its first paragraph), which quotes the
    schedules as the source and the tuner wrote them."""
    return text.split("\n\n", 1)[1]


@pytest.mark.parametrize("path", WRAPPED, ids=_ids(WRAPPED))
def test_lines_are_under_100_columns(path: Path) -> None:
    # (a pragma would need a line splice to break, and splices are what we keep out)
    long = [line for line in _body(path.read_text()).splitlines()
            if len(line) >= 100 and not line.lstrip().startswith("#pragma")]  # fmt: skip
    assert not long, f"{len(long)} lines of 100 columns or more, the first: {long[0]}"


@pytest.mark.parametrize("path", EVERY, ids=_ids(EVERY))
def test_no_loop_runs_once(path: Path) -> None:
    once = re.findall(r"for \([\w: ]+? (\w+) = 0; \1 < 1; ", path.read_text())
    assert not once, f"loops of one iteration over {once}"


@pytest.mark.parametrize("path", EVERY, ids=_ids(EVERY))
def test_bit_patterns_of_floats_have_names(path: Path) -> None:
    """Infinity and NaN appear by name (``tsr_infinity()``, ``tsr::infinity()``): their bit
    patterns stand only in the one helper that names them."""
    for pattern in ("0x7f800000", "0x7fc00000", "0x7fffffff"):
        assert path.read_text().count(pattern) <= 1, pattern


#: The name an emitter gives a value that it knows nothing about: a letter, numbered.
_LETTERED = re.compile(r"\b[vts]_\d+\b")


@pytest.mark.parametrize("path", EVERY, ids=_ids(EVERY))
def test_temporaries_are_not_numbered_letters(path: Path) -> None:
    """A value the source leaves unnamed is called after what it holds (``sum_sq``,
    ``rsqrt_mean_square_eps``), not ``v_1``, ``t_3`` or ``s_1``: the golden files held
    709 such names before temporaries were named so, and hold none now."""
    lettered = Counter(_LETTERED.findall(path.read_text()))
    assert not lettered, f"numbered temporaries: {dict(lettered)}"


#: What the library's normalizations compute without naming it, by example: the sum of
#: squares of rmsnorm, softmax's row maximum and sum of exponentials, rmsnorm's and
#: layernorm's reciprocal square roots (named after the source's names inside them), a
#: loss's mean and its negation.
_HELD = {
    "norms": ("sum_sq", "row_max", "row_sum", "sum_exp", "rsqrt_mean_square_eps",
              "rsqrt_variance_eps"),
    "train_mlp": ("row_max", "row_sum", "sum_exp", "row_mean", "neg_row_mean"),
}  # fmt: skip
HELD = sorted(p for name in _HELD for p in GOLDEN.glob(f"{name}/target.*"))


@pytest.mark.parametrize("path", HELD, ids=_ids(HELD))
def test_temporaries_are_named_after_what_they_hold(path: Path) -> None:
    text = path.read_text()
    missing = [n for n in _HELD[path.parent.name] if not re.search(rf"\b{n}\b", text)]
    assert not missing, f"no temporary named {missing}"


@pytest.mark.parametrize("path", EVERY, ids=_ids(EVERY))
def test_every_inlined_header_paragraph_is_used(path: Path) -> None:
    """Each paragraph of the inlined header that defines a name is there because the
    file uses one of its names outside it."""
    text = path.read_text()
    match = _HEADER_END.search(text)
    assert match is not None
    header, rest = text[: match.end()], text[match.end() :]
    _, sections, _ = split(header)
    unused = []
    for part in (p for s in sections for p in paragraphs(s.text)):
        elsewhere = header.replace(part.text, "") + rest
        if part.defines and not any(re.search(rf"\b{n}\b", elsewhere) for n in part.defines):
            unused.append(sorted(part.defines))
    assert not unused, f"inlined but never used: {unused}"


#: The SIMT kernels.
SIMT = [p for p in WRAPPED if "cpu" not in p.name]
#: Where a CPU program writes a tile's extent: a loop bound, a row stride of a tile's
#: element, the size of a fill or copy, a loaded tile's rows and columns.
_CPU_EXTENT = re.compile(
    r"; [ij] < (\d+);|\[[ij] \* (\d+) \+|std::(?:fill|copy)_n\(\w+, (\d+),"
    r"|tsr::(?:load_tile|load_corner|row_tile)\([^,]+, (\w+), (\w+), "
)
CPU = sorted(GOLDEN.glob("*/target.cpu-native.cpp"))


@pytest.mark.parametrize("path", CPU, ids=_ids(CPU))
def test_cpu_tile_extents_are_named(path: Path) -> None:
    """A CPU program writes its tiles' extents (loop bounds, strides, buffer sizes) as
    the constants it declares, ``for (i = 0; i < BM; ++i)`` and ``acc[i * BN + j]``:
    a number there that equals a declared tile size is a tile written as a number."""
    for kernel in re.split(r"\n// ---- ", _HEADER_END.split(path.read_text())[-1])[1:]:
        program = kernel.split("_launch(")[0]
        sizes = set(re.findall(r"constexpr tsr::i64 \w+ = (\d+);", program))
        numbers = [n for m in _CPU_EXTENT.finditer(program) for n in m.groups() if n in sizes]
        assert not numbers, f"{kernel.splitlines()[0]}: extents written as {numbers}"


@pytest.mark.parametrize("path", CPU, ids=_ids(CPU))
def test_cpu_launch_counts_programs_in_named_tiles(path: Path) -> None:
    """The launch counts a grid's programs in the tiles that its program declares,
    ``tsr::ceil_div(N, BN)``, not ``tsr::ceil_div(N, 256)`` beside ``BN = 256``."""
    for kernel in re.split(r"\n// ---- ", _HEADER_END.split(path.read_text())[-1])[1:]:
        program, launch = kernel.split("_launch(", 1)
        sizes = set(re.findall(r"constexpr tsr::i64 \w+ = (\d+);", program))
        blocks = re.findall(r"_count = tsr::ceil_div\([^,]+, (\d+)\);", launch)
        numbers = [n for n in blocks if n in sizes]
        assert not numbers, f"{kernel.splitlines()[0]}: blocks written as {numbers}"


#: A store under a condition, and the condition of a masked read in its value.
_GUARDED_STORE = re.compile(r"if \((.+?)\)\s+\w+\[.*?\] =\s*(.*?);\n", re.S)
_GUARDED_READ = re.compile(r"\(([^()?]+) \? ")


@pytest.mark.parametrize("path", SIMT, ids=_ids(SIMT))
def test_a_read_inside_a_store_does_not_test_its_condition_again(path: Path) -> None:
    """``if (row < R) out[..] = (row < R ? x[..] : 0.0f)`` tests a bound the ``if``
    already has: a read inside a store leaves out the store's own condition terms."""
    text = path.read_text()
    for store in _GUARDED_STORE.finditer(text):
        held = set(store[1].split(" && "))
        repeated = [c for r in _GUARDED_READ.finditer(store[2]) for c in r[1].split(" && ")
                    if c in held]  # fmt: skip
        assert not repeated, f"{store[0][:80]}: tests {repeated} again"


@pytest.mark.parametrize("path", SIMT, ids=_ids(SIMT))
def test_tile_constants_are_named(path: Path) -> None:
    """No integer literal of a tile's size repeats in a kernel more than a few times:
    it is a named constant there. (The CPU programs are measured more closely above: a
    size that the source specializes, ``-D D=256``, is a number there, however often.)
    Comments are not code: the ``.tsr`` lines they cite (``gemm.tsr:16``) and the grid a
    kernel's comment describes are not counted. Nor are a SYCL file's host functions,
    which come under the same rule as its kernels but hold no tile: the byte counts of
    the intermediates they allocate are the sizes the source writes (``256*B*T`` floats
    of ``Tensor["B", "T", 256, f32]``)."""
    sections = re.split(r"\n// ---- ", _HEADER_END.split(path.read_text())[-1])[1:]
    kernels = [s for s in sections if "the host function of" not in s.split("\n", 1)[0]]
    worst = Counter()
    for kernel in kernels:
        code = re.sub(r"//.*", "", kernel)
        counts = Counter(re.findall(rf"(?<![\w.])(\d{{{len(str(_SMALL))},}})(?![\w.])", code))
        worst |= Counter({n: c for n, c in counts.items() if int(n) >= _SMALL})
    assert max(worst.values(), default=0) <= 3, worst.most_common(3)


#: A kernel over vectors whose length is a quotient of sizes.
_HALVES = """
@kernel
def halves(r: Tensor["R", f32], x: Tensor["R/2", f32], y: Tensor["R/2", f32]):
    T = tile.context()
    tile.store(y, tile.load(x, rows=T.m) * 2.0)
"""


@pytest.mark.parametrize("target", ["cuda", "hip", "opencl", "sycl"])
def test_a_quotient_extent_is_named_once(target: str) -> None:
    """A mask tests an extent that divides a size (``y: Tensor["R/2"]``) by the name the
    kernel declares it under once, after the tensor's axis (``y_size``, as
    ``quant_linear``'s ``scale_rows`` for ``scale: Tensor["K/32", "N"]``), not by the
    division that each unrolled fragment's mask would write again."""
    source = tessera.compile(_HALVES, target=target).source
    kernel = re.sub(r"//.*", "", source.split("// ---- halves")[1].split("\n// ---- ")[0])
    assert re.search(r"const long (long )?y_size = \(R\)/2;", kernel), kernel
    assert kernel.count("(R)/2") == 1 and "e < y_size)" in kernel, kernel


def test_tma_stages_announce_named_bytes() -> None:
    """The bytes that a stage's TMA copies announce to its barrier are a constant the
    kernel declares from its tile sizes, and a stage starts at a multiple of them."""
    source = (GOLDEN / "mlp/target.cuda-sm_90a.cu").read_text()
    assert "constexpr int A_TILE_BYTES = BM*BK*2;" in source
    announced = re.findall(r"aligned \? (\w+) : 0", source)
    assert announced and not [n for n in announced if n.isdigit()], announced
    assert "tsr_tma_load_2d(b_tile_smem + ((kb + 2) % 4) * BK*BN, " in source


#: A gemm whose sizes ``M`` and ``K`` are specialized to numbers that equal its tiles.
_SPECIALIZED_GEMM = """
@kernel.schedule(Schedule(block=(64, 64), k=32, warps=4, stages=2))
def g(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return A @ B
"""


@pytest.mark.parametrize("target", ["cpu", "opencl", "sycl", "cuda", "hip"])
def test_offsets_name_the_tile_sizes_they_step_by(target: str) -> None:
    """``BM*pid_m`` and ``kb * BK``, with the sizes declared once per kernel; a number
    that equals a tile size without being one (``M`` and ``K`` given by ``-D``) is not
    that tile: it stays a number, or, on the SIMT targets, the library gemm's own name
    for the size its caller fixes (``K``, declared ``= 32``)."""
    source = tessera.compile(_SPECIALIZED_GEMM, target=target, defines={"M": 64, "K": 32})
    kernel = source.source.split("// ---- g")[1]
    for name, value in (("BM", 64), ("BN", 64), ("BK", 32)):
        declared = rf"(constexpr (int|tsr::i64) {name} = {value};|enum {{ {name} = {value} }};)"
        assert re.search(declared, kernel), name
    assert "BM*pid_m" in kernel and "BN*pid_n" in kernel and "BK*kb" in kernel
    assert not re.search(r"\b(64|32)\*(pid_[mn]|kb)\b", kernel)
    assert re.search(r"kb \* BK < (32|K)\b|ceil_div\(32, BK\)", kernel)  # K is not BK
    if re.search(r"\bK\b", kernel):
        assert re.search(r"(constexpr int K = 32;|enum { K = 32 };)", kernel)
    assert re.search(r"(\(BM\*pid_m( \+ i)?\)|\brow) \* (32|K)\b", kernel)  # the row stride too


#: A product whose inner and column sizes the source fixes, and a tile kernel that steps
#: by a number.
_FIXED_GEMM = """
@kernel
def fixed(A: Tensor["M", 96, f32], B: Tensor[96, 40, f32]) -> Tensor["M", 40, f32]:
    return A @ B

@kernel
def stepped(x: Tensor["M", "K", f32], w: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 16):
        acc += tile.dot(tile.load(x, rows=T.m, cols=kb), tile.load(w, kb, cols=T.n))
    return acc
"""


@pytest.mark.parametrize("target", ["opencl", "sycl", "cuda", "hip"])
def test_sizes_the_source_fixes_keep_the_library_names(target: str) -> None:
    """The library gemm over ``[M, 96] @ [96, 40]`` declares its ``K`` and ``N`` and
    strides by them, and a ``tile.range_n`` step written as 16 is a tile, ``BK``: the
    numbers stand once, in the declarations. The CPU program keeps the numbers."""
    source = tessera.compile(_FIXED_GEMM, target=target).source
    fixed, stepped = source.split("// ---- fixed")[1], source.split("// ---- stepped")[1]
    for name, value in (("K", 96), ("N", 40)):
        assert re.search(rf"(constexpr int {name} = {value};|enum {{ {name} = {value} }};)", fixed)
        numbers = re.findall(rf"(?<![\w.]){value}(?![\w.])", re.sub(r"//.*", "", fixed))
        assert len(numbers) == 1, (name, len(numbers))
    assert re.search(r"\* N \+ BN\*pid_n", fixed) and re.search(r"kb \* BK < K", fixed)
    assert re.search(r"(constexpr int BK = 16;|enum { BK = 16 };)", stepped)
    assert "kb * BK < K" in stepped and not re.search(r"\b16\*kb\b", stepped)
    cpu = tessera.compile(_FIXED_GEMM, target="cpu").source.split("// ---- fixed")[1]
    assert not re.search(r"\b(K|N) = ", cpu)


def test_a_product_over_fixed_sizes_runs_to_the_reference() -> None:
    """The names are the numbers: the OpenCL program computes the same product (ragged:
    37 rows, output poisoned first)."""
    pytest.importorskip("pyopencl")
    lib = tessera.compile(_FIXED_GEMM, target="opencl").load()
    rng = np.random.default_rng(11)
    a = rng.standard_normal((37, 96)).astype(np.float32)
    b = rng.standard_normal((96, 40)).astype(np.float32)
    for f in (lib.fixed, lib.stepped):
        out = np.full((37, 40), np.nan, np.float32)
        f(a, b, out=out)
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_tensors_loaded_for_a_graph_op_are_named_and_cite_its_line() -> None:
    """The bias that ``gelu(matmul(A, B) + bias)`` adds is loaded as ``bias_tile``, under
    the comment of the graph function's line, not as an anonymous ``t`` before it."""
    source = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cpu").source
    kernel = source.split("// ---- linear_gelu: one program")[1]
    lines = [line.strip() for line in kernel.splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("tsr::load_tile(bias_tile, "))
    assert lines[at - 1] == "// mlp.tsr:13: return gelu(matmul(A, B) + bias)"


def test_a_loop_of_one_iteration_becomes_its_body() -> None:
    """The counter is 0 in the body, the terms it cancels go, and a body whose
    declaration would meet a sibling's keeps braces of its own."""
    lines = """\
  #pragma unroll
  for (int fm = 0; fm < 1; ++fm) {
    #pragma unroll
    for (int rs = 0; rs < 2; ++rs) {
      const int r = fm * 2 + rs;
      m[wave * 16 + fm * 16 + (lane / 4)] = a_frag[fm] + r;
    }
  }
  for (int fm = 0; fm < 1; ++fm) tsr_mma(&acc[(fm * 32 + fn) * 4], a_frag[fm], b_frag);
  for (int frag = 0; frag < 1; ++frag) {
    const int i = frag / 1 * 16 + row;
    x[i] = (float)(i);
  }
  const long long i = 3;""".splitlines()
    assert without_single_iterations(lines) == """\
  #pragma unroll
  for (int rs = 0; rs < 2; ++rs) {
    const int r = rs;
    m[wave * 16 + (lane / 4)] = a_frag[0] + r;
  }
  tsr_mma(&acc[fn * 4], a_frag[0], b_frag);
  {
    const int i = row;
    x[i] = (float)(i);
  }
  const long long i = 3;""".splitlines()


def test_an_offset_plus_an_index_that_repeats_is_named() -> None:
    """``BM*pid_m + i`` written twice in a block of straight-line code becomes ``row``,
    declared at its head; a sum that is not one operand (``T - BM*pid_m + i``,
    ``BM*pid_m + i * 8``), a block that writes it once, and the body of a loop that
    unrolls (whose copies add their part to the address as an immediate) keep it."""
    lines = """\
  for (long long j = lid; j < D; j += 256) {
    if (BM*pid_m + i < T) out[(BM*pid_m + i) * D + j] = f(BM*pid_m + i);
    x = T - BM*pid_m + i + (BM*pid_m + i * 8);
  }
  {
    const int j = lane % 4;
    y = BN*pid_n + j;
  }
  for (int c = 0; c < 8; ++c) {
    const int j = tx + c * 16;
    if (BN*pid_n + j < N) out[BN*pid_n + j] = 0;
  }""".splitlines()
    named = with_named_indices(lines, frozenset({"BM", "BN"}), "long long")
    assert named[:5] == """\
  for (long long j = lid; j < D; j += 256) {
    const long long row = BM*pid_m + i;
    if (row < T) out[row * D + j] = f(row);
    x = T - BM*pid_m + i + (BM*pid_m + i * 8);
  }""".splitlines()
    assert named[5:] == lines[4:]
