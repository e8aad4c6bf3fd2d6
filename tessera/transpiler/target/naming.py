"""Names printed into generated source: valid, unique, and as close to the ``.tsr`` as can be.

One ``Namer`` per generated function. Names from the source keep their spelling
where the target language allows it (``acc.1`` becomes ``acc_1``); a clash with a
keyword, a reserved name or an earlier name gets a numeric suffix.
"""

from __future__ import annotations

import re

__all__ = ["Namer", "C_KEYWORDS", "C_LIBRARY", "GPU_BUILTINS", "OPENCL_BUILTINS", "OWN_PREFIX",
           "symbol_names"]  # fmt: skip

#: The prefix of every name the tile-primitives headers and the emitters declare at a
#: GPU file's scope (``tsr_group_sum``, ``tsr_smem``, ``tsr_tensor_map``; the header's
#: constants in capitals, ``TSR_WARP_SIZE``), as ``tsr::`` is the CPU header's
#: namespace: a name from the source loses it, in either case, as it loses the two
#: underscores that C reserves to the compiler, so that it never meets one of them.
OWN_PREFIX = "tsr_"

#: C and C++ keywords, the standard types and macros of the headers a generated file
#: includes, and names the generated code declares itself.
_WORDS = """alignas alignof and asm auto bool break case catch char class const constexpr
    const_cast continue decltype default delete do double dynamic_cast else enum explicit
    export extern false float for friend goto if inline int long mutable namespace new
    noexcept not nullptr operator or private protected public register reinterpret_cast
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void
    volatile wchar_t while xor area std tsr i64 kernel local global private constant i j r
    size_t ptrdiff_t intptr_t uintptr_t int8_t int16_t int32_t int64_t uint8_t uint16_t
    uint32_t uint64_t NULL NAN INFINITY HUGE_VAL HUGE_VALF FLT_MAX FLT_MIN FLT_EPSILON
    DBL_MAX DBL_MIN DBL_EPSILON INT_MAX INT_MIN UINT_MAX LONG_MAX LONG_MIN LLONG_MAX
    LLONG_MIN M_PI M_E MAXFLOAT EOF errno stdin stdout stderr CLK_LOCAL_MEM_FENCE
    CLK_GLOBAL_MEM_FENCE"""
C_KEYWORDS = frozenset(_WORDS.split())

_MATH = """acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh erf erfc exp
    exp2 expm1 fabs fdim floor fma fmax fmin fmod frexp hypot ilogb ldexp lgamma llrint
    llround log log10 log1p log2 logb lrint lround modf nan nearbyint nextafter pow
    remainder remquo rint round scalbln scalbn sin sinh sqrt tan tanh tgamma trunc"""
_LIBRARY = """norm normf norm3d norm3df norm4d norm4df rnorm rnormf rnorm3d rnorm3df rnorm4d
    rnorm4df rhypot rhypotf rcbrt rcbrtf normcdf normcdff normcdfinv normcdfinvf erfinv
    erfinvf erfcinv erfcinvf erfcx erfcxf sincos sincosf sincospi sincospif sinpi sinpif
    cospi cospif exp10 exp10f rsqrt rsqrtf j0 j0f j1 j1f jn jnf y0 y0f y1 y1f yn ynf
    cyl_bessel_i0 cyl_bessel_i0f cyl_bessel_i1 cyl_bessel_i1f fdivide fdividef max min
    abs labs llabs div ldiv printf fprintf sprintf snprintf puts malloc calloc realloc
    free memcpy memmove memset memcmp strlen strcmp abort exit atexit assert clock time
    rand srand select poll read write open close sleep usleep signal qsort main"""
#: Functions a GPU file's headers declare with C linkage (the C math library, in its
#: float and long double forms too, CUDA's additions, and what the host headers of
#: nvcc and hipcc bring), which an ``extern "C"`` kernel cannot be named; nor ``main``,
#: which no CUDA, HIP or OpenCL kernel may be.
C_LIBRARY = frozenset(
    [f"{name}{form}" for name in _MATH.split() for form in ("", "f", "l")] + _LIBRARY.split()
)


_GPU = """threadIdx blockIdx blockDim gridDim warpSize dim3 atomicAdd atomicSub atomicMax
    atomicMin atomicExch atomicCAS get_global_id get_local_id get_group_id get_local_size
    get_global_size get_num_groups get_work_dim barrier mem_fence read_mem_fence
    write_mem_fence mad mad24 mul24 clamp mix step smoothstep sign degrees radians
    vload_half vstore_half half uchar ushort uint ulong"""
_OPENCL = """get_global_offset acospi asinpi atanpi atan2pi tanpi fract pown powr rootn
    maxmag minmag lgamma_r cross dot distance
    length normalize fast_distance fast_length fast_normalize abs_diff add_sat hadd rhadd
    clz mad_hi mad_sat mul_hi rotate sub_sat upsample popcount isequal isnotequal isgreater
    isgreaterequal isless islessequal islessgreater isfinite isinf isnan isnormal isordered
    isunordered signbit any all bitselect shuffle shuffle2 vec_step prefetch
    async_work_group_copy async_work_group_strided_copy wait_group_events read_imagef
    read_imagei read_imageui read_imageh write_imagef write_imagei write_imageui
    write_imageh get_image_width get_image_height get_image_depth get_image_dim
    get_image_channel_data_type get_image_channel_order get_image_array_size native_divide
    native_recip native_powr native_exp10 native_rsqrt half_divide half_recip half_powr
    half_exp10 half_rsqrt ctz get_fence get_global_linear_id get_local_linear_id"""
#: OpenCL's atomic functions (1.1 and its 1.0 extensions'), and the half-precision
#: loads and stores in every width and rounding.
_ATOMICS = "add sub xchg inc dec cmpxchg min max and or xor"
_HALF = [f"{op}{a}_half{n}{r}" for op in ("vload", "vstore") for a in ("", "a")
         for n in ("", 2, 3, 4, 8, 16) for r in ("", "_rte", "_rtz", "_rtp", "_rtn")
         if op == "vstore" or not r]  # fmt: skip
_SCALARS = "char uchar short ushort int uint long ulong longlong ulonglong float double half"
#: What CUDA, HIP and OpenCL C declare in every kernel's scope: the thread indices,
#: OpenCL's work-item functions and conversions, the vector types. A source name that
#: is one of them would hide it from the code around it.
GPU_BUILTINS = frozenset(
    _GPU.split()
    + [f"{t}{n}" for t in _SCALARS.split() for n in (1, 2, 3, 4, 8, 16)]
    + [f"{op}_{t}" for op in ("as", "convert") for t in _SCALARS.split()]
    + [f"{form}_{m}" for form in ("native", "half") for m in _MATH.split()]
    + [f"{op}{n}" for op in ("vload", "vstore") for n in (2, 3, 4, 8, 16)]
)
#: The rest of OpenCL C 1.2's built-in functions (math, geometric, integer, relational,
#: atomic, image, vector loads and stores). A kernel named like one overloads it, under
#: a name the runtime cannot find (``dot``); the code calls none of them, so a value may
#: have their names.
OPENCL_BUILTINS = frozenset(
    _OPENCL.split()
    + [f"{prefix}_{op}" for prefix in ("atomic", "atom") for op in _ATOMICS.split()]
    + _HALF
)


def _reserved_prefix(name: str) -> bool:
    """Whether ``name`` starts as only the compiler's names (``__shared__``) or the
    generated code's own (``tsr_smem``) may."""
    return name.startswith("__") or name.lower().startswith(OWN_PREFIX)


class Namer:
    def __init__(self, reserved: frozenset[str] = frozenset()) -> None:
        self.used: set[str] = set(C_KEYWORDS) | set(reserved)
        #: For each base, the suffix to try first: every smaller one is taken, so that
        #: a kernel of n unnamed values is named in linear time.
        self.next: dict[str, int] = {}

    def fresh(
        self, wanted: str | None, fallback: str = "t", suffixes: tuple[str, ...] = ("",)
    ) -> str:
        """A name for ``wanted``, unused so far; with ``suffixes``, a stem whose every
        suffixed form is unused, all of which it takes: a CPU kernel's name is the stem
        of its functions ``f_program`` and ``f_launch``, which neither a function
        ``f_launch``'s nor an entry's name may be."""
        base = re.sub(r"\W", "_", wanted or fallback).rstrip("_")
        while _reserved_prefix(base):
            base = base.lstrip("_")
            base = base[len(OWN_PREFIX) :] if base.lower().startswith(OWN_PREFIX) else base
        if not base or base[0].isdigit():
            base = f"{fallback}{base}"
        # Numbering goes on where the last name of this base stopped: a file with
        # thousands of temporaries does not count up from 1 for each.
        name, n = base, self.next.get(base, 1)
        while any(name + suffix in self.used for suffix in suffixes):
            name = f"{base}_{n}"
            n += 1
        self.next[base] = n
        self.used.update(name + suffix for suffix in suffixes)
        return name


def symbol_names(
    symbols: tuple[str, ...], reserved: frozenset[str] = frozenset()
) -> dict[str, str]:
    """The printed name of each symbol of a kernel's sizes and offsets (sizes, program
    ids, loop counters): its own, unless it is a keyword, a C library function the code
    may call (``max``), or one of the ``reserved`` names the generated code declares
    itself (a loop's ``i``), which would hide it."""
    taken = C_KEYWORDS | C_LIBRARY | reserved

    def kept(s: str) -> bool:
        return s not in taken and not _reserved_prefix(s)

    namer = Namer(taken | {s for s in symbols if kept(s)})
    return {s: s if kept(s) else namer.fresh(s) for s in symbols}
