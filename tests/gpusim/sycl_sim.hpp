// The parts of SYCL 2020 that Tessera's generated SYCL files use, over the simulated GPU.
//
// A generated file is compiled with this header in place of <sycl/sycl.hpp>: its kernel
// functions run as written, one fiber per work-item (gpusim.hpp), and its host functions
// run as written too: a queue's submit runs the command group at once, a parallel_for
// over an nd_range<3> runs every work-group as a simulated block (dimension 2, the
// fastest, as CUDA's x), and local accessors are laid out in the block's shared-memory
// arena, poisoned for every block. Sub-group operations meet the 32 work-items of a
// sub-group; a reduction combines them in the order of their ids.

#pragma once

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace sycl {

using half = _Float16;

template <class To, class From>
To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

struct alignas(16) uint4 {
  unsigned x, y, z, w;
  explicit uint4(unsigned v = 0) : x(v), y(v), z(v), w(v) {}
};

inline float exp(float x) { return std::exp(x); }
inline float exp2(float x) { return std::exp2(x); }
inline float log(float x) { return std::log(x); }
inline float sqrt(float x) { return std::sqrt(x); }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float tanh(float x) { return std::tanh(x); }
inline float sin(float x) { return std::sin(x); }
inline float cos(float x) { return std::cos(x); }
inline float fabs(float x) { return std::fabs(x); }
inline float rint(float x) { return std::rint(x); }
inline float floor(float x) { return std::floor(x); }
inline float ceil(float x) { return std::ceil(x); }
inline float log2(float x) { return std::log2(x); }
inline float log1p(float x) { return std::log1p(x); }
inline float expm1(float x) { return std::expm1(x); }
inline float erf(float x) { return std::erf(x); }
inline float tan(float x) { return std::tan(x); }
inline float fmod(float x, float y) { return std::fmod(x, y); }
inline float copysign(float x, float y) { return std::copysign(x, y); }
inline float pow(float x, float y) { return std::pow(x, y); }
inline float pown(float x, int n) { return std::pow(x, static_cast<float>(n)); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float fmax(float a, float b) { return std::fmax(a, b); }
inline float fmin(float a, float b) { return std::fmin(a, b); }
inline bool isnan(float x) { return std::isnan(x); }
inline bool isinf(float x) { return std::isinf(x); }

// A debug build's fault record is claimed by compare-and-swap; the work-items of a
// simulated block are fibers that switch only at barriers, so a plain exchange is atomic.
enum class memory_order { relaxed };
enum class memory_scope { device };

template <class T, memory_order, memory_scope>
struct atomic_ref {
  T& ref;
  explicit atomic_ref(T& r) : ref(r) {}
  bool compare_exchange_strong(T& expected, T desired) const {
    if (ref != expected) {
      expected = ref;
      return false;
    }
    ref = desired;
    return true;
  }
};

template <class T>
struct plus {
  T operator()(T a, T b) const { return a + b; }
};
template <class T>
struct maximum {
  T operator()(T a, T b) const { return a < b ? b : a; }
};

template <int Dims>
struct range {
  std::size_t v[3] = {1, 1, 1};
  template <class... Ts>
  explicit range(Ts... sizes) : v{static_cast<std::size_t>(sizes)...} {}
  std::size_t operator[](int d) const { return v[d]; }
};

template <int Dims>
struct nd_range {
  range<Dims> global, local;
  nd_range(range<Dims> g, range<Dims> l) : global(g), local(l) {}
};

template <int Dims>
struct group {};

constexpr int kSubGroup = 32;

struct sub_group {
  bool leader() const { return tsr_sim::thread_id() % kSubGroup == 0; }
  unsigned get_group_linear_id() const {
    return static_cast<unsigned>(tsr_sim::thread_id() / kSubGroup);
  }
  unsigned get_group_linear_range() const { return tsr_sim::block_dim.x / kSubGroup; }
};

template <int Dims>
struct nd_item {
  std::size_t get_local_id(int d) const { return d == 2 ? tsr_sim::self->index.x : 0; }
  std::size_t get_local_range(int d) const { return d == 2 ? tsr_sim::block_dim.x : 1; }
  std::size_t get_group(int d) const {
    return d == 2 ? tsr_sim::block_index.x : d == 1 ? tsr_sim::block_index.y
                                                    : tsr_sim::block_index.z;
  }
  std::size_t get_group_range(int d) const {
    return d == 2 ? tsr_sim::grid_dim.x : d == 1 ? tsr_sim::grid_dim.y : tsr_sim::grid_dim.z;
  }
  group<Dims> get_group() const { return {}; }
  sub_group get_sub_group() const { return {}; }
};

template <int Dims>
void group_barrier(group<Dims>) {
  tsr_sim::syncthreads();
}

template <class T, class Op>
T reduce_over_group(sub_group, T value, Op op) {
  struct Arg {
    T in, out;
  } arg{value, value};
  tsr_sim::meet(kSubGroup, "reduce_over_group", &arg, [op](std::vector<void*>& args) {
    T total = static_cast<Arg*>(args[0])->in;
    for (std::size_t l = 1; l < args.size(); ++l) total = op(total, static_cast<Arg*>(args[l])->in);
    for (void* a : args) static_cast<Arg*>(a)->out = total;
  });
  return arg.out;
}

template <class T>
T permute_group_by_xor(sub_group, T value, unsigned mask) {
  return tsr_sim::shfl_xor(kSubGroup, value, static_cast<int>(mask));
}

namespace access {
enum class decorated { no, yes };
}

struct event {
  void wait() {}
};

// A command group: the local accessors it allocates, in the block's arena in order.
struct handler {
  std::size_t local_bytes = 0;
  void depends_on(const event&) {}
  template <class Kernel>
  void parallel_for(const nd_range<3>& r, const Kernel& kernel) {
    if (r.local[0] != 1 || r.local[1] != 1) tsr_sim::fail("a work-group wider than dimension 2");
    const auto threads = static_cast<unsigned>(r.local[2]);
    if (r.global[2] % threads) tsr_sim::fail("a global range that is not whole work-groups");
    const tsr_sim::Index3 grid{static_cast<unsigned>(r.global[2] / threads),
                               static_cast<unsigned>(r.global[1]),
                               static_cast<unsigned>(r.global[0])};
    tsr_sim::launch(grid, threads, local_bytes, [&] { kernel(nd_item<3>{}); });
  }
};

template <class T>
struct local_pointer {
  std::size_t offset;
  T* get() const { return reinterpret_cast<T*>(tsr_sim::block->smem + offset); }
};

template <class T, int Dims>
struct local_accessor {
  std::size_t offset;
  local_accessor(range<1> count, handler& h) {
    offset = (h.local_bytes + 15) / 16 * 16;
    h.local_bytes = offset + count[0] * sizeof(T);
  }
  template <access::decorated>
  local_pointer<T> get_multi_ptr() const {
    return {offset};
  }
};

struct queue {
  template <class Group>
  event submit(const Group& group) {
    handler h;
    group(h);
    return {};
  }
  event memcpy(void* to, const void* from, std::size_t bytes) {
    std::memcpy(to, from, bytes);
    return {};
  }
  event memcpy(void* to, const void* from, std::size_t bytes, event) {
    return memcpy(to, from, bytes);
  }
  event memset(void* p, int value, std::size_t bytes) {
    std::memset(p, value, bytes);
    return {};
  }
};

// Device memory is host memory, poisoned (NaN in every float format).
inline void* malloc_device(std::size_t bytes, queue&) {
  void* p = std::malloc(bytes ? bytes : 1);
  std::memset(p, 0xff, bytes);
  return p;
}

inline void free(void* p, queue&) { std::free(p); }

}  // namespace sycl
