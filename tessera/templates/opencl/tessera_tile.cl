// Tessera tile primitives for OpenCL C 1.2: the parts a generated file uses are
// inlined into it, so that it builds alone. Tensors of bf16 are ushort bit patterns;
// f16 tensors are read and written with vload_half / vstore_half_rte, which need no
// extension. Rounding is to nearest even everywhere, as GPUs round.

// ---------------------------------------------------------------- numerics

inline float tsr_bf16_to_float(ushort bits) { return as_float((uint)bits << 16); }

inline ushort tsr_float_to_bf16(float value) {
  const uint bits = as_uint(value);
  if (isnan(value)) return (ushort)((bits >> 16) | 0x40u);  // quiet, sign kept
  return (ushort)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

inline float tsr_round_bf16(float value) { return tsr_bf16_to_float(tsr_float_to_bf16(value)); }

// Through a ushort: OpenCL C without cl_khr_fp16 has pointers to half but no half variables.
inline float tsr_round_f16(float value) {
  ushort bits;
  vstore_half_rte(value, 0, (__private half*)&bits);
  return vload_half(0, (__private const half*)&bits);
}

// ---------------------------------------------------------------- math

inline float tsr_relu(float x) { return fmax(x, 0.0f); }
inline float tsr_sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
inline float tsr_silu(float x) { return x / (1.0f + exp(-x)); }

// The tanh form of gelu, as the CPU backend and the float64 reference compute it.
inline float tsr_gelu(float x) {
  return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// ---------------------------------------------------------------- group reductions

// Every thread of the group passes its partial and gets the group's total. `scratch`
// holds one float per thread; the group size is a power of two.
inline float tsr_group_sum(__local float* scratch, float value) {
  const int lid = get_local_id(0);
  scratch[lid] = value;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] += scratch[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float total = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);  // the next reduction may write scratch again
  return total;
}

inline float tsr_group_max(__local float* scratch, float value) {
  const int lid = get_local_id(0);
  scratch[lid] = value;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] = fmax(scratch[lid], scratch[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float total = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return total;
}

// end of the Tessera tile primitives
