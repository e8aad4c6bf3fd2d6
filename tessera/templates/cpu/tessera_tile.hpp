// Tessera tile primitives for CPUs: C++17, OpenMP, no other dependency.
//
// Generated kernels call these; the compiler inlines this header into every
// .cpp it writes, so the output builds alone. Tiles are row-major float
// arrays: low-precision types are widened exactly on load and rounded to
// nearest even when a value of that type is produced, as the GPU does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <pthread.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC vectorizes the max and min reductions that `omp simd reduction` marks; Clang (14
// at least) cannot without -ffinite-math-only, keeps them scalar, and says so with
// -Wpass-failed. The result is the same either way, so the remark is silenced.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

namespace tsr {

using i64 = std::int64_t;

inline i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------- numerics

// Bit casts the vectorizer sees through, unlike a memcpy. (The header needs GCC >= 12
// or Clang >= 9: __builtin_bit_cast and __builtin_shufflevector.)
inline std::uint32_t bits_of(float x) { return __builtin_bit_cast(std::uint32_t, x); }
inline float float_of(std::uint32_t u) { return __builtin_bit_cast(float, u); }

// Infinity and the quiet NaN by name, as the GPU targets have tsr_infinity() and tsr_nan().
inline constexpr float infinity() { return std::numeric_limits<float>::infinity(); }
inline constexpr float nan() { return std::numeric_limits<float>::quiet_NaN(); }

// Storage types: the bits of a 16- or 8-bit float.
struct bf16 { std::uint16_t bits; };
struct f16 { std::uint16_t bits; };
struct e4m3 { std::uint8_t bits; };
struct e5m2 { std::uint8_t bits; };

inline float to_float(float x) { return x; }
inline float to_float(std::int32_t x) { return static_cast<float>(x); }
inline float to_float(std::int8_t x) { return static_cast<float>(x); }

inline float to_float(bf16 x) { return float_of(static_cast<std::uint32_t>(x.bits) << 16); }

// A small float with `e` exponent bits and `m` mantissa bits, IEEE-style subnormals.
template <int E, int M>
inline float small_to_float(std::uint32_t bits) {
  const std::uint32_t sign = (bits >> (E + M)) & 1u;
  const std::uint32_t exp = (bits >> M) & ((1u << E) - 1u);
  const std::uint32_t man = bits & ((1u << M) - 1u);
  const int bias = (1 << (E - 1)) - 1;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(man), 1 - bias - M);
  } else {
    value = std::ldexp(static_cast<float>(man | (1u << M)), static_cast<int>(exp) - bias - M);
  }
  return sign ? -value : value;
}

inline float to_float(f16 x) {
  const std::uint32_t exp = (x.bits >> 10) & 0x1Fu;
  if (exp == 0x1Fu) {  // inf or nan
    const float inf = infinity();
    const float v = (x.bits & 0x3FFu) ? nan() : inf;
    return (x.bits & 0x8000u) ? -v : v;
  }
  return small_to_float<5, 10>(x.bits);
}

inline float to_float(e4m3 x) {  // e4m3fn: no infinities, S.1111.111 is nan
  if ((x.bits & 0x7Fu) == 0x7Fu) return nan();
  return small_to_float<4, 3>(x.bits);
}

inline float to_float(e5m2 x) {
  const std::uint32_t exp = (x.bits >> 2) & 0x1Fu;
  if (exp == 0x1Fu) {
    const float inf = infinity();
    const float v = (x.bits & 0x3u) ? nan() : inf;
    return (x.bits & 0x80u) ? -v : v;
  }
  return small_to_float<5, 2>(x.bits);
}

// Round to `m` mantissa bits, to nearest even, keeping f32's exponent range.
inline float round_mantissa(float x, int m) {
  if (!std::isfinite(x)) return x;
  const std::uint32_t u = bits_of(x);
  const int drop = 23 - m;
  const std::uint32_t half = (1u << (drop - 1)) - 1u + ((u >> drop) & 1u);
  return float_of((u + half) & ~((1u << drop) - 1u));
}

inline float round_bf16(float x) {
  if (std::isnan(x)) return x;
  return round_mantissa(x, 7);
}

inline bf16 from_float_bf16(float x) {
  return bf16{static_cast<std::uint16_t>(bits_of(round_bf16(x)) >> 16)};
}

// Round to a small float (e exponent bits, m mantissa bits), to nearest even, with
// subnormals; `max_finite` is the largest value, beyond which `overflow` is returned.
inline float round_small(float x, int e, int m, float max_finite, float overflow) {
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  const int bias = (1 << (e - 1)) - 1;
  const float tiny = std::ldexp(1.0f, 1 - bias);  // smallest normal
  float r;
  if (a < tiny) {
    const float step = std::ldexp(1.0f, 1 - bias - m);
    r = std::nearbyint(a / step) * step;  // the default rounding mode is to nearest even
  } else {
    r = round_mantissa(a, m);
  }
  if (r > max_finite) r = overflow;
  return std::signbit(x) ? -r : r;
}

inline float round_f16(float x) {
  return round_small(x, 5, 10, 65504.0f, infinity());
}
inline float round_e4m3(float x) {
  return round_small(x, 4, 3, 448.0f, nan());
}
inline float round_e5m2(float x) {
  return round_small(x, 5, 2, 57344.0f, infinity());
}
inline float round_tf32(float x) { return round_mantissa(x, 10); }

inline std::uint32_t small_bits(float r, int e, int m) {
  // r is already representable: rebuild its bits.
  const std::uint32_t sign = std::signbit(r) ? 1u : 0u;
  const float a = std::fabs(r);
  const int bias = (1 << (e - 1)) - 1;
  std::uint32_t out;
  if (std::isnan(r)) {  // e4m3fn's one NaN, or the quiet NaN ml_dtypes and the GPUs write
    out = (e == 4 && m == 3) ? 0x7Fu : (((1u << e) - 1u) << m) | (1u << (m - 1));
  } else if (std::isinf(r)) {
    out = ((1u << e) - 1u) << m;
  } else if (a < std::ldexp(1.0f, 1 - bias)) {
    out = static_cast<std::uint32_t>(std::ldexp(a, bias - 1 + m));
  } else {
    int exponent;
    const float frac = std::frexp(a, &exponent);  // a = frac * 2^exponent, frac in [0.5, 1)
    out = (static_cast<std::uint32_t>(exponent - 1 + bias) << m) |
          (static_cast<std::uint32_t>(std::ldexp(frac, m + 1)) & ((1u << m) - 1u));
  }
  return (sign << (e + m)) | out;
}

inline void store_as(float* dst, float x) { *dst = x; }
inline void store_as(std::int32_t* dst, float x) { *dst = static_cast<std::int32_t>(x); }
// A float converts to an integer toward zero, as C converts it; an i8 keeps the low 8 bits
// of that i32 (numpy's astype(np.int32).astype(np.int8)).
inline void store_as(std::int8_t* dst, float x) {
  *dst = static_cast<std::int8_t>(static_cast<std::uint32_t>(static_cast<std::int32_t>(x)));
}
inline void store_as(bf16* dst, float x) { *dst = from_float_bf16(x); }

inline void store_as(f16* dst, float x) {
  dst->bits = static_cast<std::uint16_t>(small_bits(round_f16(x), 5, 10));
}

inline void store_as(e4m3* dst, float x) {
  dst->bits = static_cast<std::uint8_t>(small_bits(round_e4m3(x), 4, 3));
}

inline void store_as(e5m2* dst, float x) {
  dst->bits = static_cast<std::uint8_t>(small_bits(round_e5m2(x), 5, 2));
}

// A saturating conversion's first step (`@saturate`, `cast(..., saturate=True)`): a value
// past [lo, hi] becomes the bound, infinities included; NaN stays NaN, and rounding to the
// dtype comes after (the bounds are values of it). docs/numerics.md gives the semantics.
inline float saturate(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }
// An integer has no NaN: a saturating conversion of NaN to one gives 0.
inline float saturate_int(float x, float lo, float hi) {
  return std::isnan(x) ? 0.0f : saturate(x, lo, hi);
}

// ---------------------------------------------------------------- integers

// The exact sum of an i8 product from its two parts, each an integer held exactly in a
// float (the library's gemm_i8): high * radix + low in i32 arithmetic, which never
// wraps for the K that an i8 product allows.
inline std::int32_t join_i32(float high, float low, std::int32_t radix) {
  return static_cast<std::int32_t>(high) * radix + static_cast<std::int32_t>(low);
}

// A cast to an integer dtype inside a kernel: the value the tensor element would hold.
inline float round_i32(float x) { return static_cast<float>(static_cast<std::int32_t>(x)); }
inline float round_i8(float x) {
  std::int8_t held;
  store_as(&held, x);
  return static_cast<float>(held);
}

// ---------------------------------------------------------------- math

// exp without a library call, so that loops over tiles vectorize: Cody-Waite range
// reduction x = n ln2 + r, a degree-6 polynomial for e^r on |r| <= ln2/2 (Cephes'
// coefficients), and 2^n built in the exponent bits; within 2 ulp of expf. Below
// -87.34 (where f32 goes subnormal) the result is 0, so exp(-inf) = 0 as masks need.
constexpr float kExpLow = -87.33654475f, kExpHigh = 88.72283905f;

// n = round(x / ln2) for x in [kExpLow, kExpHigh]: truncating a positive value is a floor
// that vectorizes (a negative one keeps the loop scalar).
inline int exp_n(float x) { return static_cast<int>(x * 1.44269504f + 256.5f) - 256; }

// e^r for r = x - n ln2, with n = exp_n(x); a NaN x gives NaN.
inline float exp_poly(float x, int ni) {
  const float n = static_cast<float>(ni);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

inline float exp(float x) {
  const float xc = x > kExpHigh ? kExpHigh : (x < kExpLow ? kExpLow : x);
  const int ni = exp_n(xc);
  // 2^n as 2^n1 * 2^n2 with both halves well inside the exponent range (n is -126..128)
  const int n1 = ni / 2, n2 = ni - n1;
  const float s1 = float_of(static_cast<std::uint32_t>(n1 + 127) << 23);
  const float s2 = float_of(static_cast<std::uint32_t>(n2 + 127) << 23);
  float y = exp_poly(xc, ni) * s1 * s2;
  y = x < kExpLow ? 0.0f : y;
  y = x > kExpHigh ? infinity() : y;
  return x != x ? x : y;  // nan stays nan
}

inline float tanh(float x) {  // 1 - 2 / (e^2x + 1), odd, exact at +-inf
  const float a = std::fabs(x);
  const float t = 1.0f - 2.0f / (tsr::exp(2.0f * a) + 1.0f);
  return x < 0.0f ? -t : t;
}

inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float larger(float r, float x) { return x > r ? x : r; }
// c ? a : b with both sides evaluated: a select the vectorizer takes as it is, where a
// conditional load inside a lambda can keep a loop scalar.
inline float select(bool c, float a, float b) { return c ? a : b; }
inline float sigmoid(float x) { return 1.0f / (1.0f + tsr::exp(-x)); }
inline float silu(float x) { return x / (1.0f + tsr::exp(-x)); }
inline float relu(float x) { return x > 0.0f ? x : 0.0f; }
inline float gelu(float x) {  // the tanh approximation
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tsr::tanh(k * (x + 0.044715f * x * x * x)));
}

// ---------------------------------------------------------------- exp of scores

// exp for x <= 0 (or NaN), as softmax takes it: a score less its row's maximum. Equal to
// exp there, with a third fewer instructions: n is -126..0, so 2^n is one exponent field,
// and neither the upper clamp nor infinity arises. A NaN x reaches the polynomial and
// comes out NaN. Softmax, online or not, spends most of its time here.
inline float exp_nonpositive(float x) {
  const float xc = x < kExpLow ? kExpLow : x;
  const int ni = exp_n(xc);
  const float y = exp_poly(xc, ni) * float_of(static_cast<std::uint32_t>(ni + 127) << 23);
  return x < kExpLow ? 0.0f : y;
}

// ---------------------------------------------------------------- debug checks

// The first failed check of a debug build, for the runtime to read after the call: a
// bounds check's number (-1 while none has failed), the index, the tile's size and the
// extent; a sentinel's number (-1 while none has failed), the first non-finite element's
// index, how many there are, and its value.
struct Fault {
  i64 site, index, size, extent, sentinel, first, count;
  float value;
};
inline Fault fault{-1, 0, 0, 0, -1, 0, 0, 0.0f};

// A failed bounds check: the first one of a call is kept, and the program ends.
inline void out_of_bounds(i64 site, i64 index, i64 size, i64 extent) {
#pragma omp critical(tsr_fault)
  if (fault.site < 0 && fault.sentinel < 0) {
    fault.site = site;
    fault.index = index;
    fault.size = size;
    fault.extent = extent;
  }
}

// A debug build's sentinel after a launch: whether the `count` elements at `data` hold
// NaN or infinity, which it records.
template <typename T>
inline bool non_finite(i64 sentinel, const T* data, i64 count) {
  i64 bad = 0, first = -1;
  for (i64 i = 0; i < count; ++i) {
    if (!std::isfinite(to_float(data[i]))) {
      first = first < 0 ? i : first;
      ++bad;
    }
  }
  if (bad == 0 || fault.site >= 0 || fault.sentinel >= 0) return bad > 0;
  fault.sentinel = sentinel;
  fault.first = first;
  fault.count = bad;
  fault.value = to_float(data[first]);
  return true;
}

// The first failure since the last time it was taken, as seven integers and a float
// (in the eighth); none after.
inline void take_fault(i64* out) {
  const i64 words[7] = {fault.site,     fault.index, fault.size, fault.extent,
                        fault.sentinel, fault.first, fault.count};
  std::memcpy(out, words, sizeof words);
  std::memcpy(out + 7, &fault.value, sizeof fault.value);
  fault = Fault{-1, 0, 0, 0, -1, 0, 0, 0.0f};
}

// ---------------------------------------------------------------- extremes

// As fmax and fmin (a NaN operand gives the other), with one compare and one select,
// which vectorize where a call to std::fmax may not.
inline float max_of(float a, float b) { return a >= b || b != b ? a : b; }
inline float min_of(float a, float b) { return a <= b || b != b ? a : b; }

// ---------------------------------------------------------------- floor division

// a % b and a // b as Python and NumPy define them: a remainder with the sign of b, and
// the quotient rounded toward minus infinity, computed from the exact remainder as
// CPython computes it. A zero b gives NaN or infinity, as NumPy's float ops do.
inline float mod(float a, float b) {
  const float r = std::fmod(a, b);
  return r == 0.0f ? std::copysign(0.0f, b) : (r < 0.0f) != (b < 0.0f) ? r + b : r;
}
inline float floordiv(float a, float b) {
  if (b == 0.0f) return a / b;
  const float r = std::fmod(a, b);
  const float q = (a - r) / b - (r != 0.0f && (r < 0.0f) != (b < 0.0f) ? 1.0f : 0.0f);
  if (q == 0.0f) return std::copysign(0.0f, a / b);
  const float whole = std::floor(q);
  return q - whole > 0.5f ? whole + 1.0f : whole;
}
// Of integers, a zero b gives 0, as NumPy's integer // and % do.
inline float floordiv_int(float a, float b) { return b == 0.0f ? 0.0f : floordiv(a, b); }
inline float mod_int(float a, float b) { return b == 0.0f ? 0.0f : mod(a, b); }

// ---------------------------------------------------------------- gather and scatter

// The column a gather reads or a scatter writes: the index (an integer held in a float
// tile) clamped into [0, size), so that an index nobody checked stays inside the row.
inline i64 clamp_index(float index, i64 size) {
  const i64 i = static_cast<i64>(index);
  return i < 0 ? 0 : i < size ? i : size - 1;
}

// ---------------------------------------------------------------- dropout

// Philox4x32-10 (Salmon, Moraes, Dror and Shaw, SC'11), the first word of the block for
// the counter (n, 0, stream, 0) under the key `seed`: a counter-based generator, so
// element n of a tensor draws the same number in whichever program, thread and order it
// is computed, on every backend. Dropout draws on stream 0, stochastic rounding on 1.
inline std::uint32_t philox(std::uint64_t seed, std::uint64_t n, std::uint32_t stream) {
  std::uint32_t c0 = static_cast<std::uint32_t>(n), c1 = static_cast<std::uint32_t>(n >> 32);
  std::uint32_t c2 = stream, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int i = 0; i < 10; ++i) {
    const std::uint64_t p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32);
    c0 = hi1 ^ c1 ^ k0;
    c1 = static_cast<std::uint32_t>(p1);
    c2 = hi0 ^ c3 ^ k1;
    c3 = static_cast<std::uint32_t>(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// x dropped with probability p, else scaled by 1 / (1 - p): kept when the top 24 bits
// of element n's draw, as a fraction of 2^24 (exact in a float), are at least p.
inline float dropout(float x, std::int64_t seed, std::int64_t n, float p) {
  const float u = static_cast<float>(philox(static_cast<std::uint64_t>(seed),
                                            static_cast<std::uint64_t>(n), 0) >> 8) * 0x1p-24f;
  return u >= p ? x * (1.0f / (1.0f - p)) : 0.0f;
}

// A packed i4 tensor (docs/numerics.md): element o is the low nibble of byte o / 2 for
// an even o and the high nibble for an odd o, each a two's-complement value in [-8, 7].
// A float converts to i4 toward zero and keeps the low 4 bits, as an i8 keeps 8.
struct i4 { std::uint8_t pair; };
inline int nibble_of(float x) {
  return static_cast<int>(static_cast<std::uint32_t>(static_cast<std::int32_t>(x)) & 15u);
}
inline float from_nibble(int nibble) { return static_cast<float>((nibble ^ 8) - 8); }
inline float round_i4(float x) { return from_nibble(nibble_of(x)); }

// An i4 tensor from element `at` on, indexed as a pointer is.
struct i4_view {
  const i4* bytes;
  i64 at;
  i4_view operator+(i64 n) const { return {bytes, at + n}; }
  float operator[](i64 j) const {
    const i64 o = at + j;
    return from_nibble((bytes[o >> 1].pair >> ((o & 1) * 4)) & 15);
  }
};

// The first n elements of an i4 row, widened: a byte, two elements, a step, which GCC
// and Clang vectorize (an element a step, through i4_view's index, stayed scalar, and
// W4A16 at M = 1 took 2.5 times as long).
inline void widen_row(float* out, i4_view row, i64 n) {
  const i64 lead = row.at & 1 && n > 0 ? 1 : 0;  // a row that starts in a byte's high nibble
  if (lead) out[0] = row[0];
  const std::uint8_t* bytes = &row.bytes[(row.at + lead) >> 1].pair;
  const i64 pairs = (n - lead) / 2;
#pragma omp simd
  for (i64 q = 0; q < pairs; ++q) {
    out[lead + 2 * q] = from_nibble(bytes[q] & 15);
    out[lead + 2 * q + 1] = from_nibble(bytes[q] >> 4);
  }
  if (lead + 2 * pairs < n) out[n - 1] = row[n - 1];
}

// An i4 tensor from element `at` on, written by store_tile two columns at a time, so
// that each byte is written whole by one program (a tile's first column and its width
// are even, as an i4 tensor's rows are).
struct i4_span {
  i4* bytes;
  i64 at;
};
inline void store_tile(i4_span dst, i64 ld, i64 r0, i64 c0, i64 rmax, i64 cmax,
                       const float* src, i64 rows, i64 cols) {
  const i64 valid = cmax - c0 < cols ? cmax - c0 : cols;
  for (i64 i = 0; i < rows && r0 + i < rmax; ++i) {
    i4* row = dst.bytes + ((dst.at + (r0 + i) * ld + c0) >> 1);
    const float* in = src + i * cols;
    for (i64 j = 0; j + 1 < valid; j += 2)
      row[j >> 1].pair = static_cast<std::uint8_t>(nibble_of(in[j]) | nibble_of(in[j + 1]) << 4);
  }
}

// ---------------------------------------------------------------- stochastic rounding

// x rounded to a float format of `mantissa` stored bits whose normal exponents start at
// `emin` (@stochastic_round, docs/numerics.md): to the neighbour toward zero, or away from
// zero when the top 24 bits of element n's draw on stream 1 are less than the share of
// the gap that x has gone past that neighbour, times 2^24 (rounded up). Integer steps, so
// every target gives the same bits; the result is a value of the format, or the power of
// two past its largest, which the conversion that follows makes infinity or NaN.
inline float stochastic_round(float x, int mantissa, int emin, std::int64_t seed, std::int64_t n) {
  const std::uint32_t bits = bits_of(x), field = bits >> 23 & 0xffu;
  if (field == 0xffu) return x;  // infinities and NaN convert as they are
  const std::uint32_t sig = field ? (bits & 0x7fffffu) | 0x800000u : bits & 0x7fffffu;
  const int exponent = static_cast<int>(field) - 127;
  const int gap = (exponent > emin ? exponent : emin) - mantissa;  // the spacing is 2^gap
  const int cut = gap - ((field ? static_cast<int>(field) : 1) - 150);  // bits of sig below it
  const std::uint32_t kept = cut < 24 ? sig >> cut : 0u, rest = sig - (cut < 24 ? kept << cut : 0u);
  const std::uint32_t bound = cut <= 24 ? rest << (24 - cut)
                              : cut >= 48 ? (rest != 0u)
                              : (rest >> (cut - 24)) + ((rest & ((1u << (cut - 24)) - 1u)) != 0u);
  const std::uint32_t draw = philox(static_cast<std::uint64_t>(seed), static_cast<std::uint64_t>(n), 1) >> 8;
  const float step = gap >= -126 ? float_of(static_cast<std::uint32_t>(gap + 127) << 23)
                                 : float_of(1u << (gap + 149));
  const float magnitude = static_cast<float>(kept + (draw < bound ? 1u : 0u)) * step;
  return float_of(bits_of(magnitude) | (bits & 0x80000000u));
}

// ---------------------------------------------------------------- threads
// libgomp's threads do not survive fork(): in a child, the first parallel region after
// the parent ran one waits forever for the parent's threads, which the child does not
// have (multiprocessing's default start on Linux, a DataLoader's workers). A child runs
// its launches on the calling thread instead; the flag is set by a fork handler that
// each library registers when it is loaded.
inline bool forked_child = false;
inline const int fork_handler = pthread_atfork(nullptr, nullptr, [] { forked_child = true; });
inline bool forked() { return forked_child; }

// ---------------------------------------------------------------- memory

// One SIMD register of floats: 16 with AVX-512, else 8 (AVX; two halves where the
// target has less). Vectors never cross a function boundary, so the code means the
// same whatever the build flags; memcpy is how unaligned rows are loaded and stored.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float f32xN __attribute__((vector_size(kLanes * sizeof(float))));

// The first n elements of a row of a tensor, as floats (packed ones have their own).
template <typename Src>
inline void widen_row(float* out, Src row, i64 n) {
  for (i64 j = 0; j < n; ++j) out[j] = to_float(row[j]);
}

// A rows x cols window of a row-major matrix with leading dimension `ld`, starting at
// (r0, c0): elements at or past (rmax, cmax) read as 0 and are never touched. `src` is a
// pointer, or a view of packed elements that indexes as one.
template <typename Src>
inline void load_tile(float* dst, i64 rows, i64 cols, Src src, i64 ld, i64 r0, i64 c0,
                      i64 rmax, i64 cmax) {
  for (i64 i = 0; i < rows; ++i) {
    const i64 r = r0 + i;
    float* out = dst + i * cols;
    if (r >= rmax) {
      for (i64 j = 0; j < cols; ++j) out[j] = 0.0f;
      continue;
    }
    const Src row = src + r * ld + c0;
    const i64 valid = cmax - c0 < cols ? (cmax - c0 > 0 ? cmax - c0 : 0) : cols;
    widen_row(out, row, valid);
    for (i64 j = valid; j < cols; ++j) out[j] = 0.0f;
  }
}

// load_tile's window, only where it lies inside (rmax, cmax): the rest of dst is left as
// it is. For a tile whose one reader looks at nothing else (a product's operand, of which
// the product reads that part only): zeroing a 256 x 256 tile for a 4 x 4 product cost
// more than the rest of the call.
template <typename Src>
inline void load_corner(float* dst, i64 rows, i64 cols, Src src, i64 ld, i64 r0, i64 c0,
                        i64 rmax, i64 cmax) {
  const i64 live_rows = rmax - r0 < rows ? (rmax - r0 > 0 ? rmax - r0 : 0) : rows;
  const i64 live_cols = cmax - c0 < cols ? (cmax - c0 > 0 ? cmax - c0 : 0) : cols;
  for (i64 i = 0; i < live_rows; ++i) {
    const Src row = src + (r0 + i) * ld + c0;
    widen_row(dst + i * cols, row, live_cols);
  }
}

// Zeros in the first `rows` rows and `live_cols` columns of a tile `cols` wide: the
// corner of an accumulator that its product and its store read.
inline void zero_corner(float* tile, i64 cols, i64 rows, i64 live_cols) {
  for (i64 i = 0; i < rows; ++i) std::fill_n(tile + i * cols, live_cols, 0.0f);
}

// Outputs at least this large are written around the caches (non-temporal stores):
// they will not stay in the last-level cache anyway, and an ordinary store would
// first read every line it writes.
constexpr i64 kStreamBytes = i64(16) << 20;

// dst[0, n) = src[0, n) with non-temporal stores where the target has them.
inline void stream_row(float* dst, const float* src, i64 n) {
  i64 j = 0;
#if defined(__x86_64__)
  for (; j < n && reinterpret_cast<std::uintptr_t>(dst + j) % 16 != 0; ++j) dst[j] = src[j];
  for (; j + 4 <= n; j += 4) _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
#endif
  for (; j < n; ++j) dst[j] = src[j];
}

template <typename T>
inline void store_tile(T* dst, i64 ld, i64 r0, i64 c0, i64 rmax, i64 cmax, const float* src,
                       i64 rows, i64 cols) {
  const i64 valid = cmax - c0 < cols ? cmax - c0 : cols;
  if constexpr (std::is_same_v<T, float>) {
    if (rmax * ld * i64(sizeof(float)) >= kStreamBytes) {
      for (i64 i = 0; i < rows && r0 + i < rmax; ++i)
        stream_row(dst + (r0 + i) * ld + c0, src + i * cols, valid);
#if defined(__x86_64__)
      _mm_sfence();  // visible to other threads before the launch's closing barrier
#endif
      return;
    }
  }
  for (i64 i = 0; i < rows && r0 + i < rmax; ++i) {
    T* row = dst + (r0 + i) * ld + c0;
    const float* in = src + i * cols;
    for (i64 j = 0; j < valid; ++j) store_as(row + j, in[j]);
  }
}

// A tile of exact i32s (join_i32's) into an i32 tensor, with no float in between.
inline void store_i32_tile(std::int32_t* dst, i64 ld, i64 r0, i64 c0, i64 rmax, i64 cmax,
                           const std::int32_t* src, i64 rows, i64 cols) {
  const i64 valid = cmax - c0 < cols ? cmax - c0 : cols;
  for (i64 i = 0; i < rows && r0 + i < rmax; ++i)
    std::copy_n(src + i * cols, valid, dst + (r0 + i) * ld + c0);
}

// Rows [r0, r0 + rows) of a row-major float tensor, whole: the tensor's own memory
// when every row is in bounds, else a copy in `edge` with the missing rows zero.
inline const float* row_tile(float* edge, i64 rows, i64 cols, const float* src, i64 r0,
                             i64 rmax) {
  if (r0 + rows <= rmax) return src + r0 * cols;
  load_tile(edge, rows, cols, src, cols, r0, 0, rmax, cols);
  return edge;
}

// One butterfly of an in-register transpose: with S lanes per block, rows a and b
// swap their off-diagonal S x S blocks. log2(kLanes) rounds of them transpose a
// kLanes x kLanes block held in kLanes vectors (two-source shuffles: one instruction
// each with AVX-512).
template <int S, std::size_t... J>
inline void swap_blocks(f32xN& a, f32xN& b, std::index_sequence<J...>) {
  const f32xN lo = __builtin_shufflevector(a, b, ((J & S) == 0 ? J : kLanes + J - S)...);
  const f32xN hi = __builtin_shufflevector(a, b, ((J & S) == 0 ? J + S : kLanes + J)...);
  a = lo;
  b = hi;
}

template <int S>
inline void transpose_rounds(f32xN* r) {
  if constexpr (S > 0) {
    for (int i = 0; i < kLanes; ++i)
      if ((i & S) == 0) swap_blocks<S>(r[i], r[i + S], std::make_index_sequence<kLanes>());
    transpose_rounds<S / 2>(r);
  }
}

// out [cols, rows] = x [rows, cols] transposed, on the corner x [m, n] only; x's rows
// are `ld` apart (a tile, or a tensor read in place). Whole kLanes x kLanes blocks go
// through registers, the ragged rest element by element. Past the corner `out` is not
// written: the product that reads it never looks there. Each block prefetches the same
// columns of the next kLanes rows: a tensor read in place (attention's keys) is read
// kLanes rows at a time, a line of each, which the hardware's prefetcher does not follow
// (a decode step's keys came in at half the copy bandwidth without it). A prefetch never
// faults, so the rows past the corner, the next block's, need no bound.
inline void transpose(float* out, const float* x, i64 rows, i64 ld, i64 m, i64 n) {
  const i64 row_blocks = m - m % kLanes, col_blocks = n - n % kLanes;
  for (i64 i = 0; i < row_blocks; i += kLanes)
    for (i64 j = 0; j < col_blocks; j += kLanes) {
      for (int t = 0; t < kLanes; ++t) __builtin_prefetch(x + (i + kLanes + t) * ld + j);
      f32xN r[kLanes];
      for (int t = 0; t < kLanes; ++t) std::memcpy(&r[t], x + (i + t) * ld + j, sizeof r[t]);
      transpose_rounds<kLanes / 2>(r);
      for (int t = 0; t < kLanes; ++t) std::memcpy(out + (j + t) * rows + i, &r[t], sizeof r[t]);
    }
  for (i64 i = 0; i < m; ++i)
    for (i64 j = i < row_blocks ? col_blocks : 0; j < n; ++j) out[j * rows + i] = x[i * ld + j];
}

// out [cols, rows] = x [rows, cols] transposed, whole.
inline void transpose(float* out, const float* x, i64 rows, i64 cols) {
  transpose(out, x, rows, cols, rows, cols);
}

// Scratch tiles start on cache lines (the compiler places each at a multiple of
// kLineFloats), so that no vector load of a tile row splits over two lines.
constexpr i64 kLineFloats = 64 / sizeof(float);
inline i64 whole_lines(i64 floats) { return ceil_div(floats, kLineFloats) * kLineFloats; }

// A per-thread scratch area for a program's tiles: grown once, reused by every program,
// and page-aligned. (With malloc's 16-byte alignment every 64-byte load of a b tile
// split over two lines: SGEMM 2048 ran 4-7% slower. A page measured 1-2% faster than a
// line.)
inline float* scratch(i64 floats) {
  constexpr i64 kPageFloats = 4096 / sizeof(float);
  static thread_local std::vector<float> area;
  const i64 size = floats + kPageFloats;
  if (static_cast<i64>(area.size()) < size) area.resize(static_cast<std::size_t>(size));
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(area.data());
  return reinterpret_cast<float*>((base + 4095) & ~std::uintptr_t(4095));
}

// The storage of slot `slot` of a function's intermediate tensors, at least `bytes`
// long. The calling thread keeps its blocks from call to call and grows one when a call
// needs more, so that a function called again does not fault its intermediates' pages in
// afresh (column sums of 4096 x 4096, through a 64 MiB intermediate: 36.3 ms a call with
// a fresh block, 10.5 ms now; bench/README.md). Functions share the blocks, as a thread
// runs one call at a time, and nothing clears a block between calls: each kernel writes
// all of its result before another kernel reads it.
inline unsigned char* buffer(std::size_t slot, i64 bytes) {
  static thread_local std::vector<std::vector<unsigned char>> blocks;
  if (blocks.size() <= slot) blocks.resize(slot + 1);
  std::vector<unsigned char>& block = blocks[slot];
  if (static_cast<i64>(block.size()) < bytes) {
    block = std::vector<unsigned char>();  // free the old block before the larger one
    block.resize(static_cast<std::size_t>(bytes));
  }
  return block.data();
}

// ---------------------------------------------------------------- dot

constexpr i64 kPanel = 2 * kLanes;  // columns of `out` one block of mma covers
#if defined(__AVX512F__)
constexpr int kRows = 8;  // 16 accumulators of 32 registers
#else
constexpr int kRows = 6;  // 12 accumulators of 16 registers
#endif

// The register-blocked core of mma: an R x kPanel block of `out` held in 2R vector
// accumulators while p runs over k; each step loads one row segment of `b` and
// broadcasts R values of `a`. R = kRows keeps the accumulators, two b vectors and a
// broadcast in the register file. (Packing the operands into panels measured slower at
// the tile sizes the CPU schedule picks: the tiles already sit in L2.) A `Fresh` block
// starts from zero instead of reading `out`: a dot, which has no accumulator.
template <int R, bool Fresh>
inline void mma_block(float* out, const float* a, const float* b, i64 ld_out, i64 ld_a,
                      i64 ld_b, i64 k) {
  f32xN c[R][2];
  for (int r = 0; r < R; ++r) {
    if constexpr (Fresh)
      c[r][0] = c[r][1] = f32xN{};
    else
      std::memcpy(c[r], out + r * ld_out, sizeof c[r]);
  }
  for (i64 p = 0; p < k; ++p) {
    f32xN b0, b1;
    std::memcpy(&b0, b + p * ld_b, sizeof b0);
    std::memcpy(&b1, b + p * ld_b + kLanes, sizeof b1);
    for (int r = 0; r < R; ++r) {
      const float x = a[r * ld_a + p];
      c[r][0] += x * b0;
      c[r][1] += x * b1;
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * ld_out, c[r], sizeof c[r]);
}

// How much of a tile axis of `size` elements is live: `bound` clamped to [0, size].
inline i64 live(i64 size, i64 bound) { return bound < 0 ? 0 : bound < size ? bound : size; }

// Calls f(std::integral_constant<int, R>{}) with R = min(rows, kRows), rows >= 1: the
// rows left at a tile's edge are one block compiled for their exact height, which keeps
// its accumulators in registers as a full block does.
template <int R = kRows, typename F>
inline void with_rows(i64 rows, F&& f) {
  if constexpr (R > 1)
    if (rows < R) return with_rows<R - 1>(rows, f);
  f(std::integral_constant<int, R>{});
}

// Before a product's blocks run: out = acc, or with Fresh (a dot) zeros where the blocks
// do not write, past the live corner of m rows and n columns.
template <bool Fresh>
inline void start_product(float* out, const float* acc, i64 M, i64 N, i64 m, i64 n) {
  if constexpr (Fresh) {
    for (i64 r = 0; r < M; ++r) std::fill(out + r * N + (r < m ? n : 0), out + (r + 1) * N, 0.0f);
  } else if (out != acc) {
    std::memcpy(out, acc, sizeof(float) * static_cast<std::size_t>(M * N));
  }
}

// One R-row block of a product over `cols` <= kPanel columns of out, from a panel of b
// that is zero past them: `block(out, ld_out)` computes a whole panel, straight into out
// for a whole one, else into a copy of out's rows, so that nothing past the last column
// is read or written.
template <int R, bool Fresh, typename Block>
inline void panel_block(float* o, i64 ld_out, i64 cols, Block&& block) {
  if (cols == kPanel) return block(o, ld_out);
  float rows[R * kPanel] = {};
  if constexpr (!Fresh)
    for (int r = 0; r < R; ++r)
      std::memcpy(rows + r * kPanel, o + r * ld_out, sizeof(float) * cols);
  block(rows, kPanel);
  for (int r = 0; r < R; ++r)
    std::memcpy(o + r * ld_out, rows + r * kPanel, sizeof(float) * cols);
}

// The rows of b a product of one row block (at most kRows rows: a decode step's p @ v)
// reads in each pass over its panels, while it prefetches the next pass's. Panel by
// panel down the whole of k, each row of b was read kPanel floats at a time, a stride
// apart, from memory, which the hardware's prefetcher does not follow: the p @ v of 4
// query rows over 256 keys of 128 values ran at a third of the copy bandwidth. The sums
// keep their order (each output's running sum goes to memory and back between passes).
constexpr i64 kSteps = 16;

// out = acc + a @ b, with a [M, ...] and b [..., N] (`out` may be `acc`; rows of a and b
// are `ld_a` and `ld_b` apart: a tile, or a tensor read in place), computed on the live
// corner only: rows of a below m, columns of b below n, and k steps of the reduction.
// Past them the operands are zero padding, so out keeps acc there. With Fresh, acc is
// zero: a dot. The columns past the last whole panel run as one more panel on a copy of
// b's columns zero-padded to a panel. (A scalar loop over them made SGEMM 1500, whose
// last tile is 220 wide, run at 0.84 of numpy.)
template <bool Fresh = false>
inline void mma(float* out, const float* a, const float* b, const float* acc, i64 M, i64 N,
                i64 m, i64 n, i64 k, i64 ld_a, i64 ld_b) {
  const i64 panels = n - n % kPanel, tail = n - panels;
  start_product<Fresh>(out, acc, M, N, m, n);
  static thread_local std::vector<float> b_tail;
  if (tail > 0) {
    b_tail.assign(static_cast<std::size_t>(k * kPanel), 0.0f);
    for (i64 p = 0; p < k; ++p)
      std::memcpy(&b_tail[p * kPanel], b + p * ld_b + panels, sizeof(float) * tail);
  }
  // One row block reads b once in any order: it goes kSteps rows of b at a time, all
  // panels, so that each row of b is read whole, in order, while it is in L1.
  const i64 steps = m <= kRows ? std::min(k, kSteps) : k;
  for (i64 i = 0; i < m; i += kRows)
    with_rows(m - i, [&](auto rows) {
      constexpr int R = decltype(rows)::value;
      float* o = out + i * N;
      auto panels_over = [&](auto fresh, i64 p0, i64 depth) {
        constexpr bool F = decltype(fresh)::value;
        const float* ai = a + i * ld_a + p0;
        for (i64 j = 0; j < panels; j += kPanel) {
          if (steps < k)  // the next pass's rows of b, this panel's lines of them
            for (i64 t = p0 + steps; t < p0 + 2 * steps; ++t) {
              __builtin_prefetch(b + t * ld_b + j);
              __builtin_prefetch(b + t * ld_b + j + kLanes);
            }
          mma_block<R, F>(o + j, ai, b + p0 * ld_b + j, N, ld_a, ld_b, depth);
        }
        if (tail > 0)
          panel_block<R, F>(o + panels, N, tail, [&](float* to, i64 ld_to) {
            mma_block<R, F>(to, ai, b_tail.data() + p0 * kPanel, ld_to, ld_a, kPanel, depth);
          });
      };
      panels_over(std::bool_constant<Fresh>{}, 0, steps);
      for (i64 p0 = steps; p0 < k; p0 += steps)
        panels_over(std::false_type{}, p0, std::min(steps, k - p0));
    });
}

inline void mma(float* out, const float* a, const float* b, const float* acc, i64 M, i64 N,
                i64 K, i64 m, i64 n, i64 k) {
  mma(out, a, b, acc, M, N, m, n, k, K, N);
}

inline void mma(float* out, const float* a, const float* b, const float* acc, i64 m, i64 n,
                i64 k) {
  mma(out, a, b, acc, m, n, k, m, n, k);
}

// out = a @ b on the live corner, zero elsewhere.
inline void dot(float* out, const float* a, const float* b, i64 M, i64 N, i64 m, i64 n, i64 k,
                i64 ld_a, i64 ld_b) {
  mma<true>(out, a, b, out, M, N, m, n, k, ld_a, ld_b);
}

inline void dot(float* out, const float* a, const float* b, i64 M, i64 N, i64 K, i64 m, i64 n,
                i64 k) {
  dot(out, a, b, M, N, m, n, k, K, N);
}

inline void dot(float* out, const float* a, const float* b, i64 m, i64 n, i64 k) {
  dot(out, a, b, m, n, k, m, n, k);
}

// The blocks of a product of narrow operands (bf16, i8) over its live corner of m rows
// and n columns of out (N columns a row): block(rows, i, j, to, ld_to) computes the
// R-row block at row i, panel j (rows an integral_constant of R) into `to`, as
// panel_block hands it over.
template <bool Fresh, typename Block>
inline void product_blocks(float* out, i64 N, i64 m, i64 n, Block&& block) {
  for (i64 i = 0; i < m; i += kRows)
    with_rows(m - i, [&](auto rows) {
      constexpr int R = decltype(rows)::value;
      for (i64 j = 0; j < n; j += kPanel)
        panel_block<R, Fresh>(out + i * N + j, N, std::min(kPanel, n - j),
                              [&](float* to, i64 ld_to) { block(rows, i, j, to, ld_to); });
    });
}

// A product of narrow operands in the portable order: the live corners of a and b widened
// into floats, then mma's sums (a build without the instruction, or TSR_PORTABLE_SUMS).
template <bool Fresh, typename T>
inline void mma_widened(float* out, const T* a, const T* b, const float* acc, i64 M, i64 N,
                        i64 m, i64 n, i64 k, i64 ld_a, i64 ld_b) {
  static thread_local std::vector<float> wide_a, wide_b;
  wide_a.resize(static_cast<std::size_t>(std::max<i64>(m * k, 1)));
  wide_b.resize(static_cast<std::size_t>(std::max<i64>(k * n, 1)));
  load_corner(wide_a.data(), m, k, a, ld_a, 0, 0, m, k);
  load_corner(wide_b.data(), k, n, b, ld_b, 0, 0, k, n);
  mma<Fresh>(out, wide_a.data(), wide_b.data(), acc, M, N, m, n, k, k, n);
}

// One row of a panel of mma_i4's weight, whole and starting on a byte (kLanes bytes),
// into `out`: kPanel elements times their scales, rounded. With AVX2 or AVX-512 the
// bytes are widened a lane each, both nibbles sign-extended with two shifts (the low one
// to the top of the lane and back, the high one from bit 24), and the even and odd
// elements interleaved by two shuffles. (Lanes that each picked a byte out of a
// broadcast word, one masked broadcast per word, cost most of W4A16's time at M = 1;
// GCC 12 compiles a byte shuffle or a conversion of a vector of bytes to scalar
// inserts, hence the widening instruction. `out` is written and read back a whole
// vector at a time: unpacked a byte a step into an array that vector loads then read,
// every load waited for the stores before it, and W4A16 ran three times slower.)
typedef std::uint32_t u32xN __attribute__((vector_size(kLanes * sizeof(std::uint32_t))));
typedef std::int32_t i32xN __attribute__((vector_size(kLanes * sizeof(std::int32_t))));
template <std::size_t... L>
inline void unpack_i4(i32xN (&q)[2], const i4* row, std::index_sequence<L...>) {
#if defined(__AVX512F__) || defined(__AVX2__)
  u32xN wide;
#if defined(__AVX512F__)
  // (the masked form: the plain one's undefined source makes GCC 12 warn)
  wide = (u32xN)_mm512_maskz_cvtepu8_epi32(
      0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
#else
  wide = (u32xN)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
#endif
  const i32xN low = (i32xN)(wide << 28) >> 28, high = (i32xN)(wide << 24) >> 28;
  q[0] = __builtin_shufflevector(low, high, (L / 2 + L % 2 * kLanes)...);
  q[1] = __builtin_shufflevector(low, high, (kLanes / 2 + L / 2 + L % 2 * kLanes)...);
#else
  // Without the instruction (kLanes is 8): each half is the nibbles of one little-endian
  // word, broadcast, lane l shifting it by 4 * l (the shuffles cost more there).
  for (int h = 0; h < 2; ++h) {
    std::uint32_t word;
    std::memcpy(&word, row + h * kLanes / 2, sizeof word);
    const u32xN nibbles = (u32xN{} + word) >> u32xN{static_cast<std::uint32_t>(4 * L)...} & 15u;
    q[h] = ((i32xN)nibbles ^ 8) - 8;
  }
#endif
}
// With zero points (`Shifted`: `zero`, one per column), each element less its zero point
// before the scale: (q - zero) * scale, both steps rounded to f32 as dequantize's are.
template <bool Shifted, typename Round>
inline void dequantize_panel_row(float* out, const i4* row, const float* scale,
                                 const float* zero, Round round) {
  i32xN q[2];
  unpack_i4(q, row, std::make_index_sequence<kLanes>{});
  for (int h = 0; h < 2; ++h) {
    f32xN s;
    std::memcpy(&s, scale + h * kLanes, sizeof s);
    f32xN x = __builtin_convertvector(q[h], f32xN);
    if constexpr (Shifted) {
      f32xN z;
      std::memcpy(&z, zero + h * kLanes, sizeof z);
      x -= z;
    }
    x *= s;
    std::memcpy(out + h * kLanes, &x, sizeof x);
  }
#pragma omp simd
  for (int l = 0; l < kPanel; ++l) out[l] = round(out[l]);
}

// One row of a panel of mma_i4's weight into memory: `cols` elements of an i4 row, less
// their zero points (if `zero`), times their scales, rounded, and zeros up to kPanel.
template <typename Round>
inline void dequantize_row(float* out, i4_view row, const float* scale, const float* zero,
                           i64 cols, Round round) {
  if (cols == kPanel && !(row.at & 1)) {
    if (zero != nullptr) return dequantize_panel_row<true>(out, row.bytes + (row.at >> 1),
                                                           scale, zero, round);
    return dequantize_panel_row<false>(out, row.bytes + (row.at >> 1), scale, zero, round);
  }
  widen_row(out, row, cols);
  if (zero != nullptr)
    for (i64 q = 0; q < cols; ++q) out[q] -= zero[q];
  for (i64 q = 0; q < cols; ++q) out[q] *= scale[q];
  std::fill(out + cols, out + kPanel, 0.0f);
#pragma omp simd
  for (int q = 0; q < kPanel; ++q) out[q] = round(out[q]);
}

// An R-row block of mma_i4 over one whole panel whose rows start on bytes, `row_bytes`
// apart: each row of the weight is dequantized and multiplied at once, the same sums in
// the same order as mma_block's over a dequantized panel. For few rows of a (a decode
// step, a small batch) a whole panel's trip through memory, a store and a load of every
// element for R FMAs, cost more than the products.
template <int R, bool Shifted, typename Round>
inline void mma_i4_block(float* out, const float* a, const i4* w, i64 row_bytes,
                         const float* scale, const float* zero, Round round, i64 ld_out,
                         i64 ld_a, i64 k) {
  f32xN c[R][2];
  for (int r = 0; r < R; ++r) std::memcpy(c[r], out + r * ld_out, sizeof c[r]);
  for (i64 p = 0; p < k; ++p) {
    float row[kPanel];
    dequantize_panel_row<Shifted>(row, w + p * row_bytes, scale, zero, round);
    f32xN b[2];
    std::memcpy(&b[0], row, sizeof b[0]);
    std::memcpy(&b[1], row + kLanes, sizeof b[1]);
    for (int r = 0; r < R; ++r) {
      const float x = a[r * ld_a + p];
      c[r][0] += x * b[0];
      c[r][1] += x * b[1];
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * ld_out, c[r], sizeof c[r]);
}

// mma with b the window of an i4 tensor from row r0 and column c0 (`ld_w` elements a row,
// none read at or past row rmax or column cmax), dequantized as the product reads it:
// round(q * scale[j]), or round((q - zero[j]) * scale[j]) with zero points (`zero` not
// null), `round` rounding to the dtype the program casts the weight to.
// With at most kRows live rows of a, one row block, each whole panel of b's columns is
// dequantized as the block reads it, a row at a time (mma_i4_block). Otherwise, and for a
// ragged last panel, one panel at a time is dequantized into k x kPanel floats that stay
// in L1, and every row block of a runs over it. Either way the weight is read once, half
// a byte an element, and never widened whole. The sums are mma's, in its order, so the
// result has the bits of the program that dequantizes the whole block first.
template <typename Round>
inline void mma_i4(float* out, const float* a, i4_view w, i64 ld_w, i64 r0, i64 c0, i64 rmax,
                   i64 cmax, const float* scale, const float* zero, Round round,
                   const float* acc, i64 M, i64 N, i64 m, i64 n, i64 k, i64 ld_a) {
  n = std::max<i64>(0, std::min(n, cmax - c0));
  k = std::max<i64>(0, std::min(k, rmax - r0));
  start_product<false>(out, acc, M, N, m, n);
  // The rows after the window, which a loop over K reads next: each program reads a few
  // bytes of every row, too far apart for the hardware to prefetch.
  const i64 ahead = std::min(2 * k, rmax - r0);
  for (i64 p = k; p < ahead; ++p)
    for (i64 j = 0; j < n; j += 128) {
      const i4_view next = w + (r0 + p) * ld_w + c0 + j;
      __builtin_prefetch(next.bytes + (next.at >> 1));
    }
  const i4_view window = w + r0 * ld_w + c0;
  const bool in_registers = m <= kRows && !(window.at & 1) && !(ld_w & 1);
  static thread_local std::vector<float> panel;
  panel.resize(static_cast<std::size_t>(k * kPanel));
  for (i64 j = 0; j < n; j += kPanel) {
    const i64 cols = std::min(kPanel, n - j);
    if (in_registers && cols == kPanel && m > 0) {
      const i4* panel_bytes = window.bytes + ((window.at + j) >> 1);
      with_rows(m, [&](auto rows) {
        constexpr int R = decltype(rows)::value;
        if (zero != nullptr)
          mma_i4_block<R, true>(out + j, a, panel_bytes, ld_w >> 1, scale + j, zero + j, round,
                                N, ld_a, k);
        else
          mma_i4_block<R, false>(out + j, a, panel_bytes, ld_w >> 1, scale + j, nullptr, round,
                                 N, ld_a, k);
      });
      continue;
    }
    for (i64 p = 0; p < k; ++p)
      dequantize_row(&panel[static_cast<std::size_t>(p * kPanel)], window + p * ld_w + j,
                     scale + j, zero ? zero + j : nullptr, cols, round);
    for (i64 i = 0; i < m; i += kRows)
      with_rows(m - i, [&](auto rows) {
        constexpr int R = decltype(rows)::value;
        panel_block<R, false>(out + i * N + j, N, cols, [&](float* to, i64 ld_to) {
          mma_block<R, false>(to, a + i * ld_a, panel.data(), ld_to, ld_a, kPanel, k);
        });
      });
  }
}

// ---------------------------------------------------------------- bf16 products

// A product of two bf16 operands accumulated in f32 (`@accum(f32)`, the default). Where
// the compiler targets AVX512_BF16 (`-march=native` on a CPU that has it), it runs on
// `vdpbf16ps`: the operands stay bf16, never widened; the right one is packed into
// panels of kPanel columns whose rows hold the pairs (b[2p][j], b[2p + 1][j]) side by
// side, as the instruction takes them, and the left one is read in place, a pair of
// each row broadcast at a time. Each lane adds its pair's products in two steps, the odd
// index first, each an f32 FMA rounded to nearest even that reads a subnormal input as
// zero and flushes a subnormal result to zero (Intel's pseudo-code, checked bit for bit
// on AMD Zen 4); so its sums round differently from mma's one FMA per k, and
// docs/numerics.md says exactly how. `-DTSR_PORTABLE_SUMS` (or a compiler without the
// instruction) gives mma's sums instead, bit for bit those of every other target.

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && !defined(TSR_PORTABLE_SUMS)
// The pairs of a k x n window of b (`ld_b` elements a row), zero past k and n, in panels
// of kPanel columns: panel q, pair p is 2 * kPanel elements, column j's two values at
// 2j and 2j + 1 (the first kLanes columns fill one vector, the next kLanes the other).
inline void pack_pairs(bf16* out, const bf16* b, i64 ld_b, i64 k, i64 n) {
  const i64 pairs = (k + 1) / 2;
  const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                       40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                       32, 0);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (i64 j = 0; j < n; j += kPanel) {
    const i64 cols = std::min(kPanel, n - j);
    bf16* panel = out + j / kPanel * pairs * 2 * kPanel;
    for (i64 p = 0; p < pairs; ++p) {
      const bf16* even = b + 2 * p * ld_b + j;
      const bool odd = 2 * p + 1 < k;
      bf16* dst = panel + p * 2 * kPanel;
      if (cols == kPanel) {
        const __m512i r0 = _mm512_loadu_si512(even);
        const __m512i r1 = odd ? _mm512_loadu_si512(even + ld_b) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(r0, low, r1));
        _mm512_storeu_si512(dst + kPanel, _mm512_permutex2var_epi16(r0, high, r1));
      } else {
        std::memset(dst, 0, sizeof(bf16) * 2 * kPanel);
        for (i64 c = 0; c < cols; ++c) {
          dst[2 * c] = even[c];
          if (odd) dst[2 * c + 1] = even[ld_b + c];
        }
      }
    }
  }
}

// An R x kPanel block of out (+)= a @ b over k, from a panel of pack_pairs: 2R vector
// accumulators, each step one pair of k: two vectors of the panel, and R broadcasts of
// a row's pair of `a` (at an odd k, its last value and a zero).
template <int R, bool Fresh>
inline void dot_pairs(float* out, const bf16* a, const bf16* panel, i64 ld_out, i64 ld_a,
                      i64 k) {
  __m512 c[R][2];
  for (int r = 0; r < R; ++r) {
    if constexpr (Fresh) {
      c[r][0] = c[r][1] = _mm512_setzero_ps();
    } else {
      c[r][0] = _mm512_loadu_ps(out + r * ld_out);
      c[r][1] = _mm512_loadu_ps(out + r * ld_out + kLanes);
    }
  }
  const i64 pairs = k / 2;
  for (i64 p = 0; p < pairs; ++p) {
    const __m512i b0 = _mm512_loadu_si512(panel + p * 2 * kPanel);
    const __m512i b1 = _mm512_loadu_si512(panel + p * 2 * kPanel + kPanel);
    for (int r = 0; r < R; ++r) {
      std::uint32_t pair;
      std::memcpy(&pair, a + r * ld_a + 2 * p, sizeof pair);
      const __m512i x = _mm512_set1_epi32(static_cast<int>(pair));
      c[r][0] = _mm512_dpbf16_ps(c[r][0], (__m512bh)x, (__m512bh)b0);
      c[r][1] = _mm512_dpbf16_ps(c[r][1], (__m512bh)x, (__m512bh)b1);
    }
  }
  if (k & 1) {
    const __m512i b0 = _mm512_loadu_si512(panel + pairs * 2 * kPanel);
    const __m512i b1 = _mm512_loadu_si512(panel + pairs * 2 * kPanel + kPanel);
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_set1_epi32(a[r * ld_a + k - 1].bits);
      c[r][0] = _mm512_dpbf16_ps(c[r][0], (__m512bh)x, (__m512bh)b0);
      c[r][1] = _mm512_dpbf16_ps(c[r][1], (__m512bh)x, (__m512bh)b1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * ld_out, c[r][0]);
    _mm512_storeu_ps(out + r * ld_out + kLanes, c[r][1]);
  }
}
#endif

// out = acc + a @ b (with Fresh, a dot: acc is zero) for bf16 operands read from their
// tensors: a's window from row ra, column ca (`ld_a` elements a row, nothing read at or
// past row rmax_a or column cmax_a), b's likewise; out is an M x N tile, computed on its
// live corner of m rows, n columns and k steps (clamped to the windows' parts inside
// their tensors), and keeps acc elsewhere (zero with Fresh).
template <bool Fresh = false>
inline void mma_bf16(float* out, const bf16* a, i64 ld_a, i64 ra, i64 ca, i64 rmax_a,
                     i64 cmax_a, const bf16* b, i64 ld_b, i64 rb, i64 cb, i64 rmax_b, i64 cmax_b,
                     const float* acc, i64 M, i64 N, i64 m, i64 n, i64 k) {
  m = std::max<i64>(0, std::min(m, rmax_a - ra));
  n = std::max<i64>(0, std::min(n, cmax_b - cb));
  k = std::max<i64>(0, std::min({k, cmax_a - ca, rmax_b - rb}));
  a += ra * ld_a + ca;
  b += rb * ld_b + cb;
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && !defined(TSR_PORTABLE_SUMS)
  start_product<Fresh>(out, acc, M, N, m, n);
  static thread_local std::vector<bf16> packed;
  const i64 pairs = (k + 1) / 2;
  packed.resize(static_cast<std::size_t>(ceil_div(n, kPanel) * pairs * 2 * kPanel));
  pack_pairs(packed.data(), b, ld_b, k, n);
  product_blocks<Fresh>(out, N, m, n, [&](auto rows, i64 i, i64 j, float* to, i64 ld_to) {
    const bf16* panel = packed.data() + j / kPanel * pairs * 2 * kPanel;
    dot_pairs<decltype(rows)::value, Fresh>(to, a + i * ld_a, panel, ld_to, ld_a, k);
  });
#else
  mma_widened<Fresh>(out, a, b, acc, M, N, m, n, k, ld_a, ld_b);
#endif
}

// ---------------------------------------------------------------- int8 products

// A product of two i8 operands (an i32 tile, which tiles hold as floats): a dot, or one
// added to an accumulator (the K loop of an int8 GEMM). Where the compiler targets
// AVX512_VNNI, it runs on `vpdpbusd`, which adds four products of an unsigned by a signed
// byte into an i32 lane: the right operand is made unsigned by adding 128 (its sign bit
// flipped) as it is packed, and 128 times each row's sum of the left operand starts that
// row's sums below zero, so each sum is the exact i32 one; it is stored in the tile
// rounded once to f32, or added to the accumulator in double (exact for the integer
// accumulators these products build) and rounded once. (Flipping the left operand
// instead cost a vector instruction a broadcast.) Elsewhere, or with
// `-DTSR_PORTABLE_SUMS`, the operands are widened and the f32 micro-kernel sums them
// into the accumulator, exact while every partial sum stays below 2^24, where both give
// the same bits (docs/numerics.md).

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(TSR_PORTABLE_SUMS)
// The quads of a k x n window of b (`ld_b` bytes a row) plus 128, as unsigned bytes,
// zero past k and n, in panels of kPanel columns: panel q, quad p is 4 * kPanel bytes,
// column j's four at 4j to 4j + 3.
inline void pack_quads(std::uint8_t* out, const std::int8_t* b, i64 ld_b, i64 k, i64 n) {
  const i64 quads = (k + 3) / 4;
  const __m128i flip = _mm_set1_epi8(-128);
  for (i64 j = 0; j < n; j += kPanel) {
    const i64 cols = std::min(kPanel, n - j);
    std::uint8_t* panel = out + j / kPanel * quads * 4 * kPanel;
    for (i64 p = 0; p < quads; ++p) {
      std::uint8_t* dst = panel + p * 4 * kPanel;
      if (cols == kPanel && 4 * p + 4 <= k) {
        for (int h = 0; h < 2; ++h) {
          __m128i r[4];
          for (int q = 0; q < 4; ++q)
            r[q] = _mm_xor_si128(flip, _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                           b + (4 * p + q) * ld_b + j + 16 * h)));
          const __m128i t0 = _mm_unpacklo_epi8(r[0], r[1]), t1 = _mm_unpackhi_epi8(r[0], r[1]);
          const __m128i t2 = _mm_unpacklo_epi8(r[2], r[3]), t3 = _mm_unpackhi_epi8(r[2], r[3]);
          __m128i* to = reinterpret_cast<__m128i*>(dst + 64 * h);
          _mm_storeu_si128(to, _mm_unpacklo_epi16(t0, t2));
          _mm_storeu_si128(to + 1, _mm_unpackhi_epi16(t0, t2));
          _mm_storeu_si128(to + 2, _mm_unpacklo_epi16(t1, t3));
          _mm_storeu_si128(to + 3, _mm_unpackhi_epi16(t1, t3));
        }
      } else {
        std::memset(dst, 0, 4 * kPanel);
        for (i64 q = 0; q < 4 && 4 * p + q < k; ++q)
          for (i64 c = 0; c < cols; ++c)
            dst[4 * c + q] = static_cast<std::uint8_t>(b[(4 * p + q) * ld_b + j + c] ^ 0x80);
      }
    }
  }
}

// c + the sums of four products of u's unsigned bytes by s's signed ones, per i32 lane:
// `vpdpbusd`, written out because GCC 12 copies the accumulator of the intrinsic into
// another register and back at every step (two moves an instruction: the int8 GEMM took
// 84 ms where it takes 61).
inline __m512i dpbusd(__m512i c, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(c) : "v"(u), "v"(s));
  return c;
}

// An R x kPanel block of out = a @ b over k (with Fresh; else out += a @ b), from a panel
// of pack_quads, each row's sums starting at its `bias` (-128 times the row's sum of a):
// 2R i32 accumulators, each step one quad of k: two vectors of the panel and R
// broadcasts of a row's quad of `a` (past k, zeros). The sums are stored as floats, or
// added to out's in double and rounded once.
template <int R, bool Fresh>
inline void dot_quads(float* out, const std::int8_t* a, const std::uint8_t* panel,
                      const std::int32_t* bias, i64 ld_out, i64 ld_a, i64 k) {
  __m512i c[R][2];
  for (int r = 0; r < R; ++r) c[r][0] = c[r][1] = _mm512_set1_epi32(bias[r]);
  const i64 quads = k / 4;
  for (i64 p = 0; p < quads; ++p) {
    const __m512i b0 = _mm512_loadu_si512(panel + p * 4 * kPanel);
    const __m512i b1 = _mm512_loadu_si512(panel + p * 4 * kPanel + 2 * kPanel);
    for (int r = 0; r < R; ++r) {
      std::int32_t quad;
      std::memcpy(&quad, a + r * ld_a + 4 * p, sizeof quad);
      const __m512i x = _mm512_set1_epi32(quad);
      c[r][0] = dpbusd(c[r][0], b0, x);
      c[r][1] = dpbusd(c[r][1], b1, x);
    }
  }
  if (k % 4) {
    const __m512i b0 = _mm512_loadu_si512(panel + quads * 4 * kPanel);
    const __m512i b1 = _mm512_loadu_si512(panel + quads * 4 * kPanel + 2 * kPanel);
    for (int r = 0; r < R; ++r) {
      std::int32_t quad = 0;
      std::memcpy(&quad, a + r * ld_a + 4 * quads, static_cast<std::size_t>(k % 4));
      const __m512i x = _mm512_set1_epi32(quad);
      c[r][0] = dpbusd(c[r][0], b0, x);
      c[r][1] = dpbusd(c[r][1], b1, x);
    }
  }
  // (GCC 12's _mm512_cvtepi32_ps warns of an uninitialized value inside itself.)
  typedef std::int32_t i32x16 __attribute__((vector_size(64)));
  typedef double f64x16 __attribute__((vector_size(128)));
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      float* const to = out + r * ld_out + h * kLanes;
      f32xN sums;
      if constexpr (Fresh) {
        sums = __builtin_convertvector((i32x16)c[r][h], f32xN);
      } else {
        f32xN acc;
        std::memcpy(&acc, to, sizeof acc);
        sums = __builtin_convertvector(__builtin_convertvector((i32x16)c[r][h], f64x16) +
                                           __builtin_convertvector(acc, f64x16),
                                       f32xN);
      }
      std::memcpy(to, &sums, sizeof sums);
    }
}
#endif

// out = acc + a @ b (with Fresh, a dot: acc is zero) for i8 operands read from their
// tensors, windows and live corner as mma_bf16's; out is an M x N tile of the sums as
// floats, and keeps acc past the live corner (zero with Fresh).
template <bool Fresh = false>
inline void mma_i8(float* out, const std::int8_t* a, i64 ld_a, i64 ra, i64 ca, i64 rmax_a,
                   i64 cmax_a, const std::int8_t* b, i64 ld_b, i64 rb, i64 cb, i64 rmax_b,
                   i64 cmax_b, const float* acc, i64 M, i64 N, i64 m, i64 n, i64 k) {
  m = std::max<i64>(0, std::min(m, rmax_a - ra));
  n = std::max<i64>(0, std::min(n, cmax_b - cb));
  k = std::max<i64>(0, std::min({k, cmax_a - ca, rmax_b - rb}));
  a += ra * ld_a + ca;
  b += rb * ld_b + cb;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(TSR_PORTABLE_SUMS)
  start_product<Fresh>(out, acc, M, N, m, n);
  static thread_local std::vector<std::uint8_t> packed;
  static thread_local std::vector<std::int32_t> bias;
  const i64 quads = (k + 3) / 4;
  packed.resize(static_cast<std::size_t>(ceil_div(n, kPanel) * quads * 4 * kPanel));
  pack_quads(packed.data(), b, ld_b, k, n);
  bias.resize(static_cast<std::size_t>(std::max<i64>(m, 1)));
  for (i64 i = 0; i < m; ++i) {
    std::int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (i64 p = 0; p < k; ++p) sum += a[i * ld_a + p];
    bias[static_cast<std::size_t>(i)] = -128 * sum;
  }
  product_blocks<Fresh>(out, N, m, n, [&](auto rows, i64 i, i64 j, float* to, i64 ld_to) {
    const std::uint8_t* panel = packed.data() + j / kPanel * quads * 4 * kPanel;
    dot_quads<decltype(rows)::value, Fresh>(to, a + i * ld_a, panel, bias.data() + i, ld_to,
                                            ld_a, k);
  });
#else
  mma_widened<Fresh>(out, a, b, acc, M, N, m, n, k, ld_a, ld_b);
#endif
}

// ---------------------------------------------------------------- narrow accumulation

// out = acc + a @ b accumulated in a 16-bit float (@accum(bf16), @accum(f16)): element by
// element, k ascending, each product (exact in f32) added in f32 and the sum rounded by
// `Round` to the dtype, on the live corner; past it out keeps acc (zero with Fresh, a
// dot). The order is docs/numerics.md's, which the GPUs' FMA loops follow too.
template <float (*Round)(float), bool Fresh = false>
inline void mma_rounded(float* out, const float* a, const float* b, const float* acc, i64 M,
                        i64 N, i64 m, i64 n, i64 k, i64 ld_a, i64 ld_b) {
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < N; ++j) {
      float sum = Fresh ? 0.0f : acc[i * N + j];
      if (i < m && j < n)
        for (i64 p = 0; p < k; ++p) sum = Round(sum + a[i * ld_a + p] * b[p * ld_b + j]);
      out[i * N + j] = sum;
    }
}

template <float (*Round)(float), bool Fresh = false>
inline void mma_rounded(float* out, const float* a, const float* b, const float* acc, i64 M,
                        i64 N, i64 K, i64 m, i64 n, i64 k) {
  mma_rounded<Round, Fresh>(out, a, b, acc, M, N, m, n, k, K, N);
}

template <float (*Round)(float), bool Fresh = false>
inline void mma_rounded(float* out, const float* a, const float* b, const float* acc, i64 m,
                        i64 n, i64 k) {
  mma_rounded<Round, Fresh>(out, a, b, acc, m, n, k, m, n, k);
}

// ---------------------------------------------------------------- online softmax

// Online softmax reads a block's scores from a plain array, and its masks as a count of
// live columns per row, `limit(i)`: a causal or ragged-edge mask says where a row stops,
// so the masked scores are never read, and the loops over a row see only contiguous
// floats, which they vectorize whole. (Computing the scores and masks through a lambda
// at each element, as an earlier version did, left 64-bit index vectors and gathers in
// the hot loop.)

// The maximum of `init` and x[0, n).
inline float row_max(const float* x, i64 n, float init) {
  float r = init;
#pragma omp simd reduction(max : r)
  for (i64 j = 0; j < n; ++j) r = larger(r, x[j]);
  return r;
}

// p[j] = round_p(e^(s[j] - base)) for j in [0, n); the sum of the unrounded terms. base
// is the row's maximum (or 0 for a row of -inf), so no exponent is positive. p may be s:
// each element is read before it is written.
template <typename Round>
inline float exp_row(float* p, const float* s, i64 n, float base, Round round_p) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (i64 j = 0; j < n; ++j) {
    const float e = exp_nonpositive(s[j] - base);
    p[j] = round_p(e);
    sum += e;
  }
  return sum;
}

// The exponent base of a row whose maximum is mx: mx, or 0 when the row is all masked.
inline float softmax_base(float mx) { return std::isinf(mx) && mx < 0 ? 0.0f : mx; }

// One block of online softmax over the rows of scores s [m, n]: p = exp(s - m_c), with
// m_c the row maxima and l_c the row sums of p, over the first limit(i) columns of row i;
// p is 0 past them, and a row with nothing live gives p = 0. p may be s.
template <typename Limit>
inline void softmax_online(float* p, float* m_c, float* l_c, const float* s, i64 m, i64 n,
                           Limit limit) {
  for (i64 i = 0; i < m; ++i) {
    const i64 cols = live(n, limit(i));
    const float mx = row_max(s + i * n, cols, -infinity());
    l_c[i] = exp_row(p + i * n, s + i * n, cols, softmax_base(mx), [](float x) { return x; });
    std::fill(p + i * n + cols, p + (i + 1) * n, 0.0f);
    m_c[i] = mx;
  }
}

// The state's rows [m_live, m): padding past the rows' edge (anything, by the tile IR's
// account), which a block leaves as it was, so that none of its work goes to them.
inline void keep_rows(float* acc_out, float* m_out, float* l_out, const float* acc,
                      const float* m_in, const float* l_in, i64 m_live, i64 m, i64 d) {
  if (acc_out != acc) std::copy(acc + m_live * d, acc + m * d, acc_out + m_live * d);
  if (m_out != m_in) std::copy(m_in + m_live, m_in + m, m_out + m_live);
  if (l_out != l_in) std::copy(l_in + m_live, l_in + m, l_out + m_live);
}

// Fold a block into the running attention state: acc [m, d], m and l [m], p [m, n],
// v [n, d] with rows ld_v apart. p is rescaled to the new row maxima and rounded with
// `round_p` (to v's dtype, as tensor cores multiply it) before p @ v, which runs on its
// live corner: the first m_live rows, n_live keys and d_live columns of v (zero padding
// past them); the rows past m_live keep their state.
template <typename Round>
inline void softmax_accumulate(float* acc_out, float* m_out, float* l_out, const float* acc,
                               const float* m_in, const float* l_in, const float* p,
                               const float* v, i64 ld_v, const float* m_c, const float* l_c,
                               i64 m, i64 n, i64 d, i64 m_live, i64 n_live, i64 d_live,
                               float* scaled, Round round_p) {
  keep_rows(acc_out, m_out, l_out, acc, m_in, l_in, m_live, m, d);
  for (i64 i = 0; i < m_live; ++i) {
    const float m_new = m_in[i] > m_c[i] ? m_in[i] : m_c[i];
    const float base = softmax_base(m_new);
    const float alpha = tsr::exp(m_in[i] - base);
    const float beta = tsr::exp(m_c[i] - base);
#pragma omp simd
    for (i64 j = 0; j < n_live; ++j) scaled[i * n + j] = round_p(p[i * n + j] * beta);
#pragma omp simd
    for (i64 j = 0; j < d; ++j) acc_out[i * d + j] = acc[i * d + j] * alpha;
    l_out[i] = l_in[i] * alpha + l_c[i] * beta;
    m_out[i] = m_new;
  }
  mma(acc_out, scaled, v, acc_out, m, d, m_live, d_live, n_live, n, ld_v);
}

// softmax_online and then softmax_accumulate of its block, in one pass over the scores
// (FlashAttention-2's order): the new row maximum comes first, so p = exp(s - m_new)
// directly, with no rescaling of p. Within float rounding of the two steps. p may be s.
// Only the first m_live rows are attended; the rest keep their state.
template <typename Limit, typename Round>
inline void attend(float* acc_out, float* m_out, float* l_out, const float* acc,
                   const float* m_in, const float* l_in, const float* s, const float* v,
                   i64 ld_v, i64 m, i64 n, i64 d, i64 m_live, i64 n_live, i64 d_live, float* p,
                   Limit limit, Round round_p) {
  keep_rows(acc_out, m_out, l_out, acc, m_in, l_in, m_live, m, d);
  for (i64 i = 0; i < m_live; ++i) {
    const i64 cols = live(n_live, limit(i));
    const float mx = row_max(s + i * n, cols, m_in[i]);
    const float base = softmax_base(mx);
    const float alpha = tsr::exp(m_in[i] - base);
    const float sum = exp_row(p + i * n, s + i * n, cols, base, round_p);
    std::fill(p + i * n + cols, p + i * n + n_live, 0.0f);
#pragma omp simd
    for (i64 j = 0; j < d; ++j) acc_out[i * d + j] = acc[i * d + j] * alpha;
    l_out[i] = l_in[i] * alpha + sum;
    m_out[i] = mx;
  }
  mma(acc_out, p, v, acc_out, m, d, m_live, d_live, n_live, n, ld_v);
}

}  // namespace tsr
