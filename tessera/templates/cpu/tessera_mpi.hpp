// Collectives of a mesh function on MPI: one process per device of the mesh; rank r has
// the coordinates of r in row-major order over the mesh axes (the last varies fastest).
// A tensor is `outer` rows of `inner` contiguous elements when a collective splits or
// joins it along a dim: `outer` is the product of the dims before it.
// MPI's C interface only: Open MPI's and MPICH's C++ bindings are deprecated and do
// not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <climits>
#include <cstdio>
#include <cstdlib>

namespace tsr {
namespace mpi {

template <class T> MPI_Datatype type_of();
template <> inline MPI_Datatype type_of<float>() { return MPI_FLOAT; }
template <> inline MPI_Datatype type_of<std::int32_t>() { return MPI_INT32_T; }

enum class Reduce { sum, max, min, mean };

[[noreturn]] inline void fail(const char* message) {
  std::fprintf(stderr, "tessera: %s\n", message);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

inline int count_of(i64 n) {
  if (n < 0 || n > INT_MAX) fail("a collective of more than 2**31 - 1 elements per device");
  return static_cast<int>(n);
}

// The devices that differ from this one only along the axes in `mask` (bit i: axis i),
// ordered by their coordinates on those axes. Called by every rank (MPI_Comm_split is
// collective), once per entry and mask.
inline MPI_Comm group(const int* sizes, int axes, unsigned mask) {
  int rank = 0, world = 0, devices = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int i = 0; i < axes; ++i) devices *= sizes[i];
  if (world != devices) fail("the number of MPI processes differs from the mesh's devices");
  int color = 0, key = 0, stride = 1;
  for (int i = axes - 1; i >= 0; --i) {
    const int coord = rank / stride % sizes[i];
    if (mask >> i & 1u) {
      key += coord * stride;
    } else {
      color += coord * stride;
    }
    stride *= sizes[i];
  }
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
  return comm;
}

inline int size_of(MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  return n;
}

// dst[c][o][:] = src[o][c][:]: the n blocks of each row of src, each row's c-th block
// to the c-th block of dst (and back, with the roles of the sizes swapped).
template <class T>
inline void regroup(const T* src, T* dst, i64 outer, i64 n, i64 inner, bool to_blocks) {
  for (i64 o = 0; o < outer; ++o)
    for (i64 c = 0; c < n; ++c) {
      const i64 row = (o * n + c) * inner, block = (c * outer + o) * inner;
      std::memcpy(dst + (to_blocks ? block : row), src + (to_blocks ? row : block),
                  static_cast<std::size_t>(inner) * sizeof(T));
    }
}

// out[i] = in_0[i] + in_1[i] + ... in rank order (max or min): the same bits on every
// rank and every run, whatever MPI's own reduction order.
template <class T>
inline void combine(const T* blocks, T* out, i64 count, int n, Reduce op) {
  for (i64 i = 0; i < count; ++i) {
    T acc = blocks[i];
    for (int c = 1; c < n; ++c) {
      const T v = blocks[c * count + i];
      acc = op == Reduce::max ? std::max(acc, v) : op == Reduce::min ? std::min(acc, v) : acc + v;
    }
    out[i] = op == Reduce::mean ? static_cast<T>(acc / static_cast<T>(n)) : acc;
  }
}

inline MPI_Op op_of(Reduce op) {
  return op == Reduce::max ? MPI_MAX : op == Reduce::min ? MPI_MIN : MPI_SUM;
}

template <class T>
inline void all_reduce(const T* in, T* out, i64 count, Reduce op, bool ordered, MPI_Comm comm) {
  const int n = size_of(comm);
  if (ordered) {
    std::vector<T> blocks(static_cast<std::size_t>(count) * n);
    MPI_Allgather(in, count_of(count), type_of<T>(), blocks.data(), count_of(count),
                  type_of<T>(), comm);
    combine(blocks.data(), out, count, n, op);
    return;
  }
  MPI_Allreduce(in, out, count_of(count), type_of<T>(), op_of(op), comm);
  if (op == Reduce::mean)
    for (i64 i = 0; i < count; ++i) out[i] = static_cast<T>(out[i] / static_cast<T>(n));
}

// The all-reduce of k tensors (a data-parallel step's gradients) in buckets: runs of
// tensors of at most `bucket_bytes` in all are packed into one message each, so that a
// step sends a few large messages instead of many small ones; a tensor of a bucket's size
// or more goes alone, unpacked.
template <class T>
inline void all_reduce_buckets(const T* const* in, T* const* out, const i64* counts, int k,
                               Reduce op, bool ordered, i64 bucket_bytes, MPI_Comm comm) {
  const i64 capacity = bucket_bytes / static_cast<i64>(sizeof(T));
  std::vector<T> packed, reduced;
  int first = 0;
  while (first < k) {
    int last = first + 1;
    i64 total = counts[first];
    while (last < k && total + counts[last] <= capacity) total += counts[last++];
    if (last == first + 1) {
      all_reduce(in[first], out[first], counts[first], op, ordered, comm);
      first = last;
      continue;
    }
    packed.resize(static_cast<std::size_t>(total));
    reduced.resize(packed.size());
    i64 at = 0;
    for (int i = first; i < last; at += counts[i++])
      std::memcpy(packed.data() + at, in[i], static_cast<std::size_t>(counts[i]) * sizeof(T));
    all_reduce(packed.data(), reduced.data(), total, op, ordered, comm);
    at = 0;
    for (int i = first; i < last; at += counts[i++])
      std::memcpy(out[i], reduced.data() + at, static_cast<std::size_t>(counts[i]) * sizeof(T));
    first = last;
  }
}

template <class T>
inline void all_gather(const T* in, T* out, i64 outer, i64 inner, MPI_Comm comm) {
  const int n = size_of(comm);
  const int bytes = count_of(outer * inner * static_cast<i64>(sizeof(T)));
  if (outer == 1) {
    MPI_Allgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, comm);
    return;
  }
  std::vector<T> blocks(static_cast<std::size_t>(outer * inner) * n);
  MPI_Allgather(in, bytes, MPI_BYTE, blocks.data(), bytes, MPI_BYTE, comm);
  regroup(blocks.data(), out, outer, n, inner, false);
}

// `inner` is the size of one device's block of a row.
template <class T>
inline void reduce_scatter(const T* in, T* out, i64 outer, i64 inner, Reduce op, bool ordered,
                           MPI_Comm comm) {
  const int n = size_of(comm);
  const i64 count = outer * inner;
  std::vector<T> blocks(static_cast<std::size_t>(count) * n);
  regroup(in, blocks.data(), outer, n, inner, true);
  if (ordered) {
    std::vector<T> received(blocks.size());
    MPI_Alltoall(blocks.data(), count_of(count), type_of<T>(), received.data(), count_of(count),
                 type_of<T>(), comm);
    combine(received.data(), out, count, n, op);
    return;
  }
  MPI_Reduce_scatter_block(blocks.data(), out, count_of(count), type_of<T>(), op_of(op), comm);
  if (op == Reduce::mean)
    for (i64 i = 0; i < count; ++i) out[i] = static_cast<T>(out[i] / static_cast<T>(n));
}

// Rows of `split_outer` x (n blocks of `split_inner`) go out block by block; the blocks
// that come back join rows of `concat_outer` x (n blocks of `concat_inner`).
template <class T>
inline void all_to_all(const T* in, T* out, i64 split_outer, i64 split_inner, i64 concat_outer,
                       i64 concat_inner, MPI_Comm comm) {
  const int n = size_of(comm);
  const i64 count = split_outer * split_inner;
  const int bytes = count_of(count * static_cast<i64>(sizeof(T)));
  std::vector<T> sent(static_cast<std::size_t>(count) * n), received(sent.size());
  regroup(in, sent.data(), split_outer, n, split_inner, true);
  MPI_Alltoall(sent.data(), bytes, MPI_BYTE, received.data(), bytes, MPI_BYTE, comm);
  regroup(received.data(), out, concat_outer, n, concat_inner, false);
}

}  // namespace mpi
}  // namespace tsr
