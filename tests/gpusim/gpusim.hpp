// A CUDA thread block, simulated on the CPU, for the generated kernels' tests.
//
// The package beside it compiles a CUDA file that tesserac wrote with this header in
// place of the functions whose bodies are PTX (the numerics' cvt, cp.async, ldmatrix,
// mma.sync, wgmma), so that the kernels run here as written, on host memory, a block at
// a time. Each thread of a block is a fiber (ucontext): it runs until it must wait for
// others (a barrier, a warp's shuffle, ldmatrix or mma, a warpgroup's wgmma), then the
// next one runs.
// What the hardware does for a warp or a warpgroup is computed here from the PTX ISA's
// definitions, written independently of the emitter that targets them:
//
//   mma.sync.m16n8k16.row.col   "Matrix Fragments for mma.m16n8k16 with floating point
//                               type": lane l = 4 g + t holds a's (g, 2t..2t+1),
//                               (g+8, ..), (g, 2t+8..), (g+8, 2t+8..); b's (2t..2t+1, g),
//                               (2t+8.., g); c's (g, 2t..2t+1), (g+8, 2t..2t+1).
//   wgmma.mma_async m64nNk16    warp w of the warpgroup owns rows 16w..16w+15 of d, in
//                               the m16n8 layout above repeated along n; a from
//                               registers is mma.sync's a for those rows; operands in
//                               shared memory are read through matrix descriptors in
//                               the canonical layouts of the 128-byte swizzle.
//
// The simulation is strict where hardware forgives by luck: shared memory starts as
// 0xff bytes (NaN in every float format), a cp.async lands only at the wait that
// covers it and a wgmma group only at the wait that covers it, and threads of a warp that meet different
// collectives, or a barrier that not every thread reaches, stop the run with a message.

#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <math.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace tsr_sim {

struct Index3 {
  unsigned x = 0, y = 0, z = 0;
};

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "gpusim: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

// A group of threads that meet at a collective (a warp, a warpgroup, the block): each
// leaves its argument; the last to arrive runs the collective for all of them.
struct Meeting {
  int arrived = 0;
  unsigned generation = 0;
  const char* kind = nullptr;
  std::vector<void*> args;
};

// One cp.async: 16 bytes read when issued, written when a wait covers it.
struct PendingCopy {
  unsigned char* dst;
  unsigned char bytes[16];
};

enum class Type { bf16, f16, fp8_e4m3, fp8_e5m2 };

// One thread's part of a wgmma: where its accumulators are, and its a registers.
struct WgmmaPart {
  float* d;
  unsigned a[4];
};

// A wgmma issued by a warpgroup and not yet waited for.
struct Wgmma {
  Type type;
  int n;
  bool a_in_registers, trans_a, trans_b;
  std::uint64_t a_desc, b_desc;
  std::vector<WgmmaPart> parts;  // by thread of the warpgroup
};

// A warpgroup's wgmma not yet waited for: those issued since the last commit, and the
// committed groups, oldest first.
struct WgmmaQueue {
  std::vector<Wgmma> open;
  std::vector<std::vector<Wgmma>> groups;
};

// The 128 bytes of a TMA tensor map, as the simulated driver encodes them (the real
// layout is the driver's own): what cuTensorMapEncodeTiled was given, strides in bytes
// for every axis, innermost first.
struct TensorMap {
  std::uint64_t magic;
  const unsigned char* address;
  std::uint32_t rank, element_bytes;
  std::uint64_t dims[5], strides[5];
  std::uint32_t box[5], swizzle;
};
static_assert(sizeof(TensorMap) == 128, "a tensor map is 128 bytes");
constexpr std::uint64_t kTensorMapMagic = 0x70616d726f736e65ull;

// One TMA copy issued and not landed: the box at `coords` of the tensor `map` describes.
struct TmaCopy {
  unsigned char* dst;
  TensorMap map;
  long long coords[5];
};

// An mbarrier: arrivals expected per phase and still pending, the transaction bytes
// still to land (announced by expect_tx less those landed), the phases completed, and
// the TMA copies that complete bytes on it and have not landed.
struct MBarrier {
  int arrivals = 0, pending = 0;
  long long tx = 0;
  unsigned phase = 0;
  std::vector<TmaCopy> copies;
};

struct Thread {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  Index3 index;
  bool done = false;
  // cp.async groups: committed ones, oldest first, and the one being issued
  std::vector<std::vector<PendingCopy>> committed;
  std::vector<PendingCopy> open;
};

constexpr std::size_t kStackBytes = 256 * 1024;

struct Block {
  std::vector<Thread> threads;
  ucontext_t scheduler;
  std::function<void()> body;
  unsigned char* smem = nullptr;  // the dynamic arena, 1024-byte aligned
  std::size_t smem_bytes = 0;
  std::map<std::pair<int, int>, Meeting> meetings;  // (group size, group) -> meeting
  std::map<int, WgmmaQueue> wgmma;                  // by warpgroup
  std::map<const void*, MBarrier> barriers;         // by address in shared memory
  unsigned long long events = 0;                    // arrivals and completions
};

inline Block* block = nullptr;
inline Thread* self = nullptr;
inline Index3 block_index, grid_dim, block_dim;

// Under AddressSanitizer every switch between a thread's stack and the scheduler's is
// announced, so that it knows which stack is live (a null `fake` for a thread that ends).
#if defined(__SANITIZE_ADDRESS__)
inline const void* scheduler_stack = nullptr;
inline std::size_t scheduler_stack_bytes = 0;
inline void to_scheduler(void** fake) {
  __sanitizer_start_switch_fiber(fake, scheduler_stack, scheduler_stack_bytes);
}
inline void from_scheduler(void* fake) {
  __sanitizer_finish_switch_fiber(fake, &scheduler_stack, &scheduler_stack_bytes);
}
inline void to_thread(void** fake, Thread& th) {
  __sanitizer_start_switch_fiber(fake, th.stack.get(), kStackBytes);
}
inline void from_thread(void* fake) { __sanitizer_finish_switch_fiber(fake, nullptr, nullptr); }
#else
inline void to_scheduler(void**) {}
inline void from_scheduler(void*) {}
inline void to_thread(void**, Thread&) {}
inline void from_thread(void*) {}
#endif

// The running thread waits: the scheduler runs the next one.
inline void yield() {
  void* fake = nullptr;
  to_scheduler(&fake);
  swapcontext(&self->context, &block->scheduler);
  from_scheduler(fake);
}

inline int thread_id() { return static_cast<int>(self->index.x); }

// The calling thread meets the others of its group of `size` (32: a warp, 128: a
// warpgroup, the block's thread count: all) at a collective of `kind`; the last to
// arrive runs `act` over everyone's arguments, then all go on.
template <class Act>
void meet(int size, const char* kind, void* arg, Act&& act) {
  const int id = thread_id();
  Meeting& m = block->meetings[{size, id / size}];
  if (m.arrived == 0) {
    m.kind = kind;
    m.args.assign(static_cast<std::size_t>(size), nullptr);
  } else if (std::strcmp(m.kind, kind) != 0) {
    std::fprintf(stderr, "gpusim: thread %d reaches %s while its group waits at %s\n", id, kind,
                 m.kind);
    fail("threads of a group diverged at a collective");
  }
  m.args[static_cast<std::size_t>(id % size)] = arg;
  ++block->events;
  if (++m.arrived == size) {
    act(m.args);
    m.arrived = 0;
    ++m.generation;
    return;
  }
  const unsigned generation = m.generation;
  while (m.generation == generation) yield();
}

inline void trampoline() {
  from_scheduler(nullptr);
  block->body();
  self->done = true;
  ++block->events;
  to_scheduler(nullptr);
}

// Runs `body` as every thread of every block of the grid, blocks one after another.
inline void launch(Index3 grid, unsigned threads, std::size_t smem_bytes,
                   const std::function<void()>& body) {
  if (threads % 32) fail("a block of threads that is not whole warps");
  std::vector<unsigned char> arena(smem_bytes + 1024);
  auto base = reinterpret_cast<std::uintptr_t>(arena.data());
  auto* smem = arena.data() + ((1024 - base % 1024) % 1024);
  grid_dim = grid;
  block_dim = Index3{threads, 1, 1};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Block b;
        b.body = body;
        b.smem = smem;
        b.smem_bytes = smem_bytes;
        std::memset(smem, 0xff, smem_bytes);
        block = &b;
        block_index = Index3{x, y, z};
        b.threads.resize(threads);
        for (unsigned t = 0; t < threads; ++t) {
          Thread& th = b.threads[t];
          th.index = Index3{t, 0, 0};
          th.stack.reset(new char[kStackBytes]);
          getcontext(&th.context);
          th.context.uc_stack.ss_sp = th.stack.get();
          th.context.uc_stack.ss_size = kStackBytes;
          th.context.uc_link = &b.scheduler;
          makecontext(&th.context, trampoline, 0);
        }
        for (;;) {
          const unsigned long long before = b.events;
          bool live = false;
          for (Thread& th : b.threads) {
            if (th.done) continue;
            live = true;
            self = &th;
            void* fake = nullptr;
            to_thread(&fake, th);
            swapcontext(&b.scheduler, &th.context);
            from_thread(fake);
          }
          if (!live) break;
          if (b.events == before) fail("deadlock: threads wait at collectives that never fill");
        }
        block = nullptr;
        self = nullptr;
      }
}

// ------------------------------------------------------------------ CUDA's names

inline void syncthreads() {
  meet(static_cast<int>(block_dim.x), "__syncthreads", nullptr, [](std::vector<void*>&) {});
}

// `value` from the lane of the warp (wavefront) of `lanes` whose index differs in the
// bits of `lane_mask`.
template <class T>
T shfl_xor(int lanes, T value, int lane_mask) {
  struct Arg {
    T in, out;
    int lane_mask;
  } arg{value, value, lane_mask};
  meet(lanes, "shuffle", &arg, [lanes](std::vector<void*>& args) {
    for (std::size_t l = 0; l < static_cast<std::size_t>(lanes); ++l) {
      auto* a = static_cast<Arg*>(args[l]);
      a->out = static_cast<Arg*>(args[l ^ static_cast<std::size_t>(a->lane_mask)])->in;
    }
  });
  return arg.out;
}

inline unsigned cvta_shared(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < block->smem || c >= block->smem + block->smem_bytes)
    fail("a shared-memory address outside the dynamic arena");
  return static_cast<unsigned>(c - block->smem);
}

template <class To, class From>
To bits(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// ------------------------------------------------------------------ numbers

inline float bf16_value(std::uint16_t b) {
  return bits<float>(static_cast<std::uint32_t>(b) << 16);
}

inline float f16_value(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31)
    magnitude = mantissa ? NAN : INFINITY;
  else
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  return bits<float>(bits<std::uint32_t>(magnitude) | sign);
}

// An fp8 value: e4m3 (the "fn" variant, whose only non-finite pattern is S.1111.111,
// NaN) or e5m2 (IEEE's layout: exponent 31 is infinity or NaN), each with subnormals.
inline float fp8_value(bool e4m3, std::uint8_t b) {
  const int mantissa_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int exponent = (b & 0x7f) >> mantissa_bits, mantissa = b & ((1 << mantissa_bits) - 1);
  const float sign = b & 0x80 ? -1.0f : 1.0f;
  if (e4m3 ? (b & 0x7f) == 0x7f : exponent == 31) return mantissa || e4m3 ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - bias - mantissa_bits);
  return sign * std::ldexp(static_cast<float>(mantissa | 1 << mantissa_bits), exponent - bias - mantissa_bits);
}

// cvt.rn.f16.f32: round to nearest even, overflow to infinity, subnormals kept.
inline std::uint16_t f16_bits(float value) {
  const std::uint32_t sign = (bits<std::uint32_t>(value) >> 16) & 0x8000u;
  const float a = std::fabs(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7c00u);
  int exponent;
  std::frexp(a, &exponent);  // a = f * 2^exponent, f in [0.5, 1)
  const int step = std::max(exponent - 11, -24);  // the spacing of f16 values near a
  const float units = std::nearbyint(std::ldexp(a, -step));  // ties to even
  const float rounded = std::ldexp(units, step);
  int e;
  std::frexp(rounded, &e);
  std::uint32_t out;
  if (rounded == 0.0f)
    out = 0;
  else if (e - 1 < -14)  // subnormal
    out = static_cast<std::uint32_t>(std::ldexp(rounded, 24));
  else
    out = static_cast<std::uint32_t>((e - 1 + 15) << 10) |
          (static_cast<std::uint32_t>(std::ldexp(rounded, 11 - e)) & 0x3ffu);
  return static_cast<std::uint16_t>(sign | out);
}

inline float value(Type type, std::uint16_t b) {
  switch (type) {
    case Type::bf16: return bf16_value(b);
    case Type::f16: return f16_value(b);
    default: return fp8_value(type == Type::fp8_e4m3, static_cast<std::uint8_t>(b));
  }
}

inline unsigned element_bytes(Type type) {
  return type == Type::bf16 || type == Type::f16 ? 2 : 1;
}

// The two 16-bit elements of a register: the lower index in the low half.
inline float low(Type type, unsigned pair) {
  return value(type, static_cast<std::uint16_t>(pair));
}
inline float high(Type type, unsigned pair) {
  return value(type, static_cast<std::uint16_t>(pair >> 16));
}

// ------------------------------------------------------------------ cp.async

inline void copy_async16(void* dst, const void* src, int bytes) {
  cvta_shared(dst);
  PendingCopy c{static_cast<unsigned char*>(dst), {}};
  if (bytes != 0 && bytes != 16) fail("cp.async with a source size other than 0 or 16");
  if (bytes) std::memcpy(c.bytes, src, 16);
  std::memset(dst, 0xff, 16);  // the old contents are gone from the issue on
  self->open.push_back(c);
}

inline void copy_commit() {
  self->committed.push_back(std::move(self->open));
  self->open.clear();
}

inline void copy_wait(int pending) {
  auto& groups = self->committed;
  while (static_cast<int>(groups.size()) > pending) {
    for (const PendingCopy& c : groups.front()) std::memcpy(c.dst, c.bytes, 16);
    groups.erase(groups.begin());
  }
}

// ------------------------------------------------------------------ TMA and mbarriers
//
// cp.async.bulk.tensor copies a box of a tensor map into shared memory: element (e0, e1,
// ...) of the box, innermost first, comes from the tensor at coords + e, or is zero past
// the tensor's edges; the box's rows (box[0] elements) lie one after another, and with
// the 128-byte swizzle, 16-byte chunk c of each 128-byte row r lies at chunk c ^ (r % 8)
// (address bits 4-6 XOR bits 7-9, from a destination aligned to 1024 bytes). Its bytes
// complete on an mbarrier, whose phase completes when its pending arrivals and its
// announced bytes (mbarrier.arrive.expect_tx) are all in. A copy lands only when a
// thread waits on its barrier, so a read of a stage that skipped the wait sees poison;
// and the destination is poisoned when the copy is issued, so a read of the stage's old
// contents after that (a slot refilled too early) sees poison too.

inline MBarrier& barrier_at(const void* bar) {
  cvta_shared(bar);
  auto found = block->barriers.find(bar);
  if (found == block->barriers.end()) fail("an mbarrier used before mbarrier.init");
  return found->second;
}

inline void mbarrier_init(void* bar, unsigned arrivals) {
  cvta_shared(bar);
  if (reinterpret_cast<std::uintptr_t>(bar) % 8) fail("an mbarrier not 8-byte aligned");
  MBarrier& b = block->barriers[bar];
  b = MBarrier{};
  b.arrivals = b.pending = static_cast<int>(arrivals);
  ++block->events;
}

inline void complete_if_done(MBarrier& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.arrivals;
    ++block->events;
  }
}

inline void mbarrier_arrive_expect_tx(void* bar, unsigned bytes) {
  MBarrier& b = barrier_at(bar);
  b.tx += bytes;
  --b.pending;
  ++block->events;
  complete_if_done(b);
}

// The bytes a copy of the map's box brings.
inline std::uint64_t box_bytes(const TensorMap& m) {
  std::uint64_t bytes = m.element_bytes;
  for (std::uint32_t k = 0; k < m.rank; ++k) bytes *= m.box[k];
  return bytes;
}

inline void tma_land(const TmaCopy& c) {
  const TensorMap& m = c.map;
  const std::uint32_t row_bytes = m.box[0] * m.element_bytes;
  std::uint64_t rows = 1;
  for (std::uint32_t k = 1; k < m.rank; ++k) rows *= m.box[k];
  for (std::uint64_t r = 0; r < rows; ++r) {
    long long at[5] = {0, 0, 0, 0, 0};
    bool inside = true;
    std::uint64_t rest = r;
    for (std::uint32_t k = 1; k < m.rank; ++k) {
      at[k] = c.coords[k] + static_cast<long long>(rest % m.box[k]);
      rest /= m.box[k];
      inside = inside && at[k] >= 0 && at[k] < static_cast<long long>(m.dims[k]);
    }
    for (std::uint32_t e = 0; e < m.box[0]; ++e) {
      at[0] = c.coords[0] + e;
      const bool live = inside && at[0] >= 0 && at[0] < static_cast<long long>(m.dims[0]);
      std::uint64_t offset = r * row_bytes + e * m.element_bytes;
      if (m.swizzle == 128) offset ^= ((offset >> 7) & 7) << 4;
      unsigned char* to = c.dst + offset;
      if (!live) {
        std::memset(to, 0, m.element_bytes);
        continue;
      }
      const unsigned char* from = m.address;
      for (std::uint32_t k = 0; k < m.rank; ++k) from += at[k] * static_cast<long long>(m.strides[k]);
      std::memcpy(to, from, m.element_bytes);
    }
  }
}

inline void tma_load(void* dst, const void* map, void* bar, const long long* coords) {
  TmaCopy c{static_cast<unsigned char*>(dst), {}, {}};
  std::memcpy(&c.map, map, sizeof c.map);
  if (c.map.magic != kTensorMapMagic) fail("a TMA copy through a tensor map the host did not encode");
  const unsigned at = cvta_shared(dst);
  const std::uint64_t bytes = box_bytes(c.map);
  if (at % (c.map.swizzle == 128 ? 1024 : 128)) fail("a TMA destination not aligned for its swizzle");
  if (at + bytes > block->smem_bytes) fail("a TMA copy past the shared-memory arena");
  for (std::uint32_t k = 0; k < c.map.rank; ++k) c.coords[k] = coords[k];
  std::memset(c.dst, 0xff, bytes);  // the old contents are gone from the issue on
  barrier_at(bar).copies.push_back(c);
}

// mbarrier.try_wait.parity, until it succeeds: the phase of parity `parity` has completed
// when the barrier's phase count has passed it. The copies on the barrier land first.
inline void mbarrier_wait(void* bar, unsigned parity) {
  for (;;) {
    MBarrier& b = barrier_at(bar);
    if ((b.phase & 1u) != parity) return;
    for (const TmaCopy& c : b.copies) {
      tma_land(c);
      b.tx -= static_cast<long long>(box_bytes(c.map));
    }
    if (!b.copies.empty()) ++block->events;
    b.copies.clear();
    if (b.tx < 0 && b.pending == 0) fail("TMA copies brought more bytes than their mbarrier was told of");
    complete_if_done(b);
    if ((b.phase & 1u) != parity) return;
    yield();
  }
}

// The driver's cuTensorMapEncodeTiled, as its documentation constrains it: a 64-byte
// aligned map, 1 to 5 axes, a 16-byte aligned address, strides of whole 16 bytes, boxes
// of 1 to 256 elements, the inner one of whole 16 bytes, and with the 128-byte swizzle
// at most 128 bytes (the simulator takes exactly 128). Returns CUDA_ERROR_INVALID_VALUE
// (1) for anything else, or for what the simulator does not model.
inline int encode_tensor_map(void* map, int type, unsigned rank, void* address,
                             const std::uint64_t* dims, const std::uint64_t* strides,
                             const std::uint32_t* box, const std::uint32_t* element_strides,
                             int interleave, int swizzle, int, int fill) {
  static const int sizes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  if (type < 0 || type > 12 || rank < 1 || rank > 5 || interleave != 0 || fill != 0) return 1;
  if (reinterpret_cast<std::uintptr_t>(map) % 64 || reinterpret_cast<std::uintptr_t>(address) % 16)
    return 1;
  TensorMap m{};
  m.magic = kTensorMapMagic;
  m.address = static_cast<const unsigned char*>(address);
  m.rank = rank;
  m.element_bytes = static_cast<std::uint32_t>(sizes[type]);
  m.swizzle = swizzle == 3 ? 128 : 0;
  if (swizzle != 0 && swizzle != 3) return 1;
  for (unsigned k = 0; k < rank; ++k) {
    if (dims[k] == 0 || dims[k] > (1ull << 32) || box[k] == 0 || box[k] > 256) return 1;
    if (element_strides[k] != 1) return 1;
    m.dims[k] = dims[k];
    m.box[k] = box[k];
    m.strides[k] = k == 0 ? m.element_bytes : strides[k - 1];
    if (k > 0 && (m.strides[k] % 16 || m.strides[k] >= (1ull << 40))) return 1;
  }
  const std::uint32_t inner = box[0] * m.element_bytes;
  if (inner % 16 || (m.swizzle == 128 && inner != 128)) return 1;
  std::memcpy(map, &m, sizeof m);
  return 0;
}

// ------------------------------------------------------------------ ldmatrix

// ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16: lane 8j + r gives the address of
// row r of matrix j; register j of lane l = 4g + t gets elements (g, 2t) and (g, 2t + 1)
// of matrix j, or with .trans (2t, g) and (2t + 1, g), the lower in the low half.
inline void ldmatrix(int count, bool trans, unsigned* r, const void* row) {
  cvta_shared(row);
  if (reinterpret_cast<std::uintptr_t>(row) % 16) fail("an ldmatrix row not 16-byte aligned");
  struct Arg {
    unsigned* r;
    const void* row;
  } arg{r, row};
  meet(32, "ldmatrix", &arg, [count, trans](std::vector<void*>& args) {
    for (int j = 0; j < count; ++j) {
      std::uint16_t m[8][8];
      for (int i = 0; i < 8; ++i)
        std::memcpy(m[i], static_cast<Arg*>(args[static_cast<std::size_t>(8 * j + i)])->row, 16);
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const unsigned lo = trans ? m[2 * t][g] : m[g][2 * t];
        const unsigned hi = trans ? m[2 * t + 1][g] : m[g][2 * t + 1];
        static_cast<Arg*>(args[static_cast<std::size_t>(l)])->r[j] = lo | hi << 16;
      }
    }
  });
}

// ------------------------------------------------------------------ mma.sync

// One lane's part of an mma.sync: its accumulators and its a and b registers.
struct MmaPart {
  float* d;
  const unsigned* a;
  const unsigned* b;
};

// d += A @ B on a warp's m16n8 fragment: lane l = 4g + t holds d's (g, 2t..2t+1) and
// (g+8, 2t..2t+1), for every k of the instruction.
template <int K>
void accumulate_m16n8(std::vector<void*>& args, const float (&A)[16][K], const float (&B)[K][8]) {
  for (int l = 0; l < 32; ++l) {
    auto* x = static_cast<MmaPart*>(args[static_cast<std::size_t>(l)]);
    const int g = l / 4, t = l % 4;
    for (int q = 0; q < 4; ++q) {
      const int row = g + (q / 2) * 8, col = 2 * t + q % 2;
      float sum = x->d[q];
      for (int k = 0; k < K; ++k) sum += A[row][k] * B[k][col];
      x->d[q] = sum;
    }
  }
}

inline void mma_m16n8k16(Type type, float* d, const unsigned* a, const unsigned* b) {
  MmaPart part{d, a, b};
  meet(32, "mma.sync.m16n8k16", &part, [type](std::vector<void*>& args) {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
      const auto* x = static_cast<MmaPart*>(args[static_cast<std::size_t>(l)]);
      const int g = l / 4, t = l % 4;
      for (int q = 0; q < 4; ++q) {
        const int row = g + (q % 2) * 8, col = 2 * t + (q / 2) * 8;
        A[row][col] = low(type, x->a[q]);
        A[row][col + 1] = high(type, x->a[q]);
      }
      for (int q = 0; q < 2; ++q) {
        B[2 * t + q * 8][g] = low(type, x->b[q]);
        B[2 * t + q * 8 + 1][g] = high(type, x->b[q]);
      }
    }
    accumulate_m16n8(args, A, B);
  });
}

// mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32 ("Matrix Fragments for mma.m16n8k8", .tf32):
// lane l = 4g + t holds a's (g, t), (g+8, t), (g, t+4), (g+8, t+4) and b's (t, g),
// (t+4, g), one 32-bit element each, of which the instruction reads the tf32 bits (the
// low 13 bits of the mantissa are ignored); c and d as for m16n8k16.
inline void mma_m16n8k8_tf32(float* d, const unsigned* a, const unsigned* b) {
  MmaPart part{d, a, b};
  meet(32, "mma.sync.m16n8k8", &part, [](std::vector<void*>& args) {
    const auto tf32 = [](unsigned bits) { return tsr_sim::bits<float>(bits & 0xffffe000u); };
    float A[16][8], B[8][8];
    for (int l = 0; l < 32; ++l) {
      const auto* x = static_cast<MmaPart*>(args[static_cast<std::size_t>(l)]);
      const int g = l / 4, t = l % 4;
      for (int q = 0; q < 4; ++q) A[g + (q % 2) * 8][t + (q / 2) * 4] = tf32(x->a[q]);
      for (int q = 0; q < 2; ++q) B[t + q * 4][g] = tf32(x->b[q]);
    }
    accumulate_m16n8(args, A, B);
  });
}

// ------------------------------------------------------------------ wgmma

// The element (mn, k) of `size` bytes (2, or 1 for fp8) of an operand that a matrix
// descriptor describes: the operand's start, its leading and stride byte offsets, in the
// 128-byte swizzle. K-major: rows of the m or n axis 128 bytes apart, eight-row groups
// `stride` apart, k along the row. MN-major (16-bit only): the other way round, 64 of m
// or n along a 128-byte row, the next 64 `leading` bytes on, eight k rows per 1024 bytes,
// the next eight `stride` on. The swizzle XORs address bits 4-6 (the 16-byte chunk of a
// 128-byte row) with bits 7-9.
inline std::uint16_t described(std::uint64_t desc, bool mn_major, int mn, int k, unsigned size) {
  const unsigned start = static_cast<unsigned>(desc & 0x3fff) << 4;
  const unsigned leading = static_cast<unsigned>((desc >> 16) & 0x3fff) << 4;
  const unsigned stride = static_cast<unsigned>((desc >> 32) & 0x3fff) << 4;
  if ((desc >> 62) != 1) fail("a matrix descriptor without the 128-byte swizzle");
  if (((desc >> 49) & 7) != 0) fail("a matrix descriptor with a base offset");
  const auto u = [](int x) { return static_cast<unsigned>(x); };
  unsigned address;
  if (mn_major && size != 2) fail("an MN-major wgmma operand that is not 16-bit");
  if (mn_major)
    address = start + u(mn / 64) * leading + u(mn % 64) * 2 + u(k / 8) * stride + u(k % 8) * 128;
  else
    address = start + u(mn / 8) * stride + u(mn % 8) * 128 + u(k) * size;
  address ^= ((address >> 7) & 7) << 4;
  if (address + size > block->smem_bytes) fail("a wgmma operand read past the dynamic arena");
  std::uint16_t element = 0;
  std::memcpy(&element, block->smem + address, size);
  return element;
}

// One wgmma: m64nNk16 of 16-bit operands, m64nNk32 of fp8 ones (32 bytes of each row).
inline void run(const Wgmma& w) {
  const unsigned size = element_bytes(w.type);
  const int K = static_cast<int>(32 / size);
  if (w.a_in_registers && size != 2) fail("a wgmma with fp8 a in registers");
  std::vector<float> A(64 * static_cast<std::size_t>(K)), B(K * static_cast<std::size_t>(w.n));
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < K; ++k) {
      if (w.a_in_registers) {  // mma.sync's a for warp m / 16
        const int l = (m % 16) % 8 * 4 + (k % 8) / 2, q = (m % 16) / 8 + (k / 8) * 2;
        const unsigned pair = w.parts[static_cast<std::size_t>(m / 16 * 32 + l)].a[q];
        A[m * K + k] = k % 2 ? high(w.type, pair) : low(w.type, pair);
      } else {
        A[m * K + k] = value(w.type, described(w.a_desc, w.trans_a, m, k, size));
      }
    }
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < w.n; ++n)
      B[k * w.n + n] = value(w.type, described(w.b_desc, w.trans_b, n, k, size));
  for (int t = 0; t < 128; ++t) {
    const int warp = t / 32, l = t % 32, g = l / 4, lane_t = l % 4;
    float* d = w.parts[static_cast<std::size_t>(t)].d;
    for (int i = 0; i < w.n / 2; ++i) {
      const int row = warp * 16 + g + ((i % 4) / 2) * 8, col = (i / 4) * 8 + 2 * lane_t + i % 2;
      float sum = d[i];
      for (int k = 0; k < K; ++k) sum += A[row * K + k] * B[k * w.n + col];
      d[i] = sum;
    }
  }
}

inline void wgmma(Type type, int n, float* d, const unsigned* a_registers, std::uint64_t a_desc,
                  bool trans_a, bool trans_b, std::uint64_t b_desc) {
  WgmmaPart part{d, {}};
  if (a_registers) std::copy(a_registers, a_registers + 4, part.a);
  Wgmma w{type, n, a_registers != nullptr, trans_a, trans_b, a_desc, b_desc, {}};
  struct Arg {
    WgmmaPart* part;
    Wgmma* w;
  } arg{&part, &w};
  meet(128, "wgmma.mma_async", &arg, [](std::vector<void*>& args) {
    auto* first = static_cast<Arg*>(args[0]);
    Wgmma issue = *first->w;
    for (void* p : args) {
      auto* x = static_cast<Arg*>(p);
      if (x->w->a_desc != issue.a_desc || x->w->b_desc != issue.b_desc)
        fail("threads of a warpgroup give one wgmma different descriptors");
      issue.parts.push_back(*x->part);
    }
    issue.parts.shrink_to_fit();
    block->wgmma[thread_id() / 128].open.push_back(std::move(issue));
  });
}

// wgmma.commit_group: the warpgroup's wgmma since the last commit become one group.
inline void wgmma_commit() {
  meet(128, "wgmma.commit_group", nullptr, [](std::vector<void*>&) {
    WgmmaQueue& q = block->wgmma[thread_id() / 128];
    q.groups.push_back(std::move(q.open));
    q.open.clear();
  });
}

// wgmma.wait_group: the warpgroup's groups run, oldest first, until `pending` are left.
inline void wgmma_wait(int pending) {
  meet(128, "wgmma.wait_group", &pending, [](std::vector<void*>& args) {
    WgmmaQueue& q = block->wgmma[thread_id() / 128];
    const int keep = *static_cast<int*>(args[0]);
    while (static_cast<int>(q.groups.size()) > keep) {
      for (const Wgmma& w : q.groups.front()) run(w);
      q.groups.erase(q.groups.begin());
    }
  });
}

// ------------------------------------------------------------------ AMD wavefronts

// v_mfma_f32_32x32x8{bf16_1k,f16} and v_mfma_f32_32x32x2f32 on a 64-lane wavefront
// (AMD's CDNA matrix instructions): lane l = 32y + x gives row x of a and column x of b
// at reduction steps k y + q, its k values per lane; register r of its accumulator is
// row (r / 4) * 8 + 4y + r % 4, column x.
template <int K, class Vec, class Acc, class Value>
Acc mfma(Vec a, Vec b, Acc c, Value value) {
  constexpr int per_lane = K / 2;
  struct Arg {
    float a[per_lane], b[per_lane], c[16];
  } arg{};
  for (int q = 0; q < per_lane; ++q) {
    arg.a[q] = value(a, q);
    arg.b[q] = value(b, q);
  }
  for (int r = 0; r < 16; ++r) arg.c[r] = c[r];
  meet(64, "mfma", &arg, [](std::vector<void*>& args) {
    float A[32][K], B[K][32];
    for (int l = 0; l < 64; ++l) {
      const auto* x = static_cast<Arg*>(args[static_cast<std::size_t>(l)]);
      for (int q = 0; q < per_lane; ++q) {
        A[l % 32][per_lane * (l / 32) + q] = x->a[q];
        B[per_lane * (l / 32) + q][l % 32] = x->b[q];
      }
    }
    for (int l = 0; l < 64; ++l) {
      auto* x = static_cast<Arg*>(args[static_cast<std::size_t>(l)]);
      for (int r = 0; r < 16; ++r) {
        const int row = r / 4 * 8 + l / 32 * 4 + r % 4, col = l % 32;
        for (int k = 0; k < K; ++k) x->c[r] += A[row][k] * B[k][col];
      }
    }
  });
  for (int r = 0; r < 16; ++r) c[r] = arg.c[r];
  return c;
}

}  // namespace tsr_sim

// ------------------------------------------------------------------ the kernels' CUDA

#define __global__
#define __device__
#define __launch_bounds__(...)
#define __align__(bytes) __attribute__((aligned(bytes)))
#define __shared__ static
#define __grid_constant__
#define threadIdx (tsr_sim::self->index)
#define blockIdx (tsr_sim::block_index)
#define blockDim (tsr_sim::block_dim)
#define gridDim (tsr_sim::grid_dim)

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

using std::isinf;
using std::isnan;

inline void __syncthreads() { tsr_sim::syncthreads(); }
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  if (mask != 0xffffffffu) tsr_sim::fail("__shfl_xor_sync with a partial mask");
  return tsr_sim::shfl_xor(32, value, lane_mask);
}
inline unsigned __cvta_generic_to_shared(const void* p) { return tsr_sim::cvta_shared(p); }
inline float __int_as_float(int x) { return tsr_sim::bits<float>(x); }
inline float __uint_as_float(unsigned x) { return tsr_sim::bits<float>(x); }
inline unsigned __float_as_uint(float x) { return tsr_sim::bits<unsigned>(x); }
inline int __float_as_int(float x) { return tsr_sim::bits<int>(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// One thread runs at a time: a compare-and-swap is a plain one.
inline int atomicCAS(int* address, int compare, int value) {
  const int old = *address;
  if (old == compare) *address = value;
  return old;
}
inline void __trap() { tsr_sim::fail("__trap: the kernel stopped the launch"); }

#ifdef TSR_SIM_CUDA
// The tile primitives whose CUDA bodies are PTX.
inline float tsr_f16_to_float(unsigned short bits) { return tsr_sim::f16_value(bits); }
inline unsigned short tsr_float_to_f16(float value) { return tsr_sim::f16_bits(value); }
inline void tsr_copy_async16(void* dst, const void* src, int bytes) {
  tsr_sim::copy_async16(dst, src, bytes);
}
inline void tsr_copy_commit() { tsr_sim::copy_commit(); }
template <int Pending>
void tsr_copy_wait() {
  tsr_sim::copy_wait(Pending);
}
inline void tsr_ldmatrix_x4(unsigned* r, const void* row) { tsr_sim::ldmatrix(4, false, r, row); }
inline void tsr_ldmatrix_x4_trans(unsigned* r, const void* row) {
  tsr_sim::ldmatrix(4, true, r, row);
}
inline void tsr_ldmatrix_x2(unsigned* r, const void* row) { tsr_sim::ldmatrix(2, false, r, row); }
inline void tsr_ldmatrix_x2_trans(unsigned* r, const void* row) {
  tsr_sim::ldmatrix(2, true, r, row);
}
inline void tsr_mma_m16n8k16_bf16(float* d, const unsigned* a, const unsigned* b) {
  tsr_sim::mma_m16n8k16(tsr_sim::Type::bf16, d, a, b);
}
inline void tsr_mma_m16n8k16_f16(float* d, const unsigned* a, const unsigned* b) {
  tsr_sim::mma_m16n8k16(tsr_sim::Type::f16, d, a, b);
}
inline void tsr_mma_m16n8k8_tf32(float* d, const unsigned* a, const unsigned* b) {
  tsr_sim::mma_m16n8k8_tf32(d, a, b);
}
inline void tsr_wgmma_fence() {}
inline void tsr_wgmma_commit() { tsr_sim::wgmma_commit(); }
template <int Pending>
void tsr_wgmma_wait() {
  tsr_sim::wgmma_wait(Pending);
}
inline void tsr_fence_async_shared() {}
inline void tsr_mbarrier_init(unsigned long long* bar, unsigned arrivals) {
  tsr_sim::mbarrier_init(bar, arrivals);
}
inline void tsr_fence_mbarrier_init() {}
inline void tsr_mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  tsr_sim::mbarrier_arrive_expect_tx(bar, bytes);
}
inline void tsr_mbarrier_wait(unsigned long long* bar, unsigned parity) {
  tsr_sim::mbarrier_wait(bar, parity);
}
inline void tsr_mbarrier_arrive(unsigned long long* bar) {
  tsr_sim::mbarrier_arrive_expect_tx(bar, 0);
}
// setmaxnreg moves registers between warpgroups; here every thread has what it needs.
template <int Registers>
void tsr_setmaxnreg_dec() {}
template <int Registers>
void tsr_setmaxnreg_inc() {}
template <class... Coords>
void tsr_sim_tma_load(void* dst, const void* map, unsigned long long* bar, Coords... coords) {
  const long long at[] = {static_cast<long long>(coords)...};
  tsr_sim::tma_load(dst, map, bar, at);
}
inline void tsr_tma_load_2d(void* dst, const void* map, unsigned long long* bar, int c0, int c1) {
  tsr_sim_tma_load(dst, map, bar, c0, c1);
}
inline void tsr_tma_load_3d(void* dst, const void* map, unsigned long long* bar, int c0, int c1,
                            int c2) {
  tsr_sim_tma_load(dst, map, bar, c0, c1, c2);
}
inline void tsr_tma_load_4d(void* dst, const void* map, unsigned long long* bar, int c0, int c1,
                            int c2, int c3) {
  tsr_sim_tma_load(dst, map, bar, c0, c1, c2, c3);
}
inline void tsr_tma_load_5d(void* dst, const void* map, unsigned long long* bar, int c0, int c1,
                            int c2, int c3, int c4) {
  tsr_sim_tma_load(dst, map, bar, c0, c1, c2, c3, c4);
}
#endif

#ifdef TSR_SIM_DRIVER
// The simulated driver's one entry point, under the real one's name.
extern "C" int cuTensorMapEncodeTiled(void* map, int type, unsigned rank, void* address,
                                      const std::uint64_t* dims, const std::uint64_t* strides,
                                      const std::uint32_t* box,
                                      const std::uint32_t* element_strides, int interleave,
                                      int swizzle, int l2, int fill) {
  return tsr_sim::encode_tensor_map(map, type, rank, address, dims, strides, box,
                                    element_strides, interleave, swizzle, l2, fill);
}

// cuLaunchKernel of a simulated module's kernel: the CUfunction is the module's
// tsr_sim_raw_<kernel>, which runs the grid with the arguments at `params`.
extern "C" int cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz, unsigned smem, void*,
                              void** params, void** extra) {
  if (by != 1 || bz != 1 || extra != nullptr) tsr_sim::fail("a launch the runtime never makes");
  using Raw = void (*)(unsigned, unsigned, unsigned, unsigned, unsigned, void**);
  reinterpret_cast<Raw>(function)(gx, gy, gz, bx, smem, params);
  return 0;
}
#endif

// HIP's names (the CUDA file's are above). The MFMA built-ins are renamed tsr_sim_amdgcn_*
// in the source: a name that starts with __builtin_ is the compiler's.
template <class T>
T __shfl_xor(T value, int lane_mask, int width = 64) {
  if (width != 64) tsr_sim::fail("__shfl_xor over part of a wavefront");
  return tsr_sim::shfl_xor(64, value, lane_mask);
}
template <class Vec, class Acc>
Acc tsr_sim_amdgcn_mfma_f32_32x32x8bf16_1k(Vec a, Vec b, Acc c, int, int, int) {
  return tsr_sim::mfma<8>(a, b, c, [](Vec v, int q) {
    return tsr_sim::bf16_value(static_cast<std::uint16_t>(v[q]));
  });
}
template <class Vec, class Acc>
Acc tsr_sim_amdgcn_mfma_f32_32x32x8f16(Vec a, Vec b, Acc c, int, int, int) {
  return tsr_sim::mfma<8>(a, b, c, [](Vec v, int q) { return static_cast<float>(v[q]); });
}
template <class Acc>
Acc tsr_sim_amdgcn_mfma_f32_32x32x2f32(float a, float b, Acc c, int, int, int) {
  return tsr_sim::mfma<2>(a, b, c, [](float v, int) { return v; });
}
