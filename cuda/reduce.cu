// GPU reductions, the twins of core/cpu/reduce.cpp. Shapes and contracts: core/kernels/reduce.h.
// Math: autograd/ops.h (sum, max, argmax).
//
// Deterministic, no atomics:
//   inner == 1   one block per output row: thread t takes r = t, t + blockDim, ... in order, then
//                a fixed shared-memory tree (block_reduce). A single row (outer == 1) longer than
//                kChunk first reduces fixed chunks of kChunk, one block each, into partials, and a
//                second launch reduces those: the same tree for any launch size.
//   inner > 1    with many outputs (outer * inner >= kWideOutputs): one thread per output column
//                (o, i), r in increasing order; neighbouring threads read neighbouring addresses
//                (coalesced). With few outputs and long columns (a bias gradient: the sum of an
//                (M, d) gradient over its M rows, d outputs), that would run d threads in all, each
//                reading M values one after another, too few threads to fill the GPU
//                (docs/benchmarks.md, "Where the time goes"). So there the columns are cut into
//                fixed chunks of kColChunk rows: a block of 32 x 8 threads sums one chunk of 32 neighbouring columns (each of
//                its 8 row lanes every 8th row, then the 8 lane sums in a fixed order), writing one
//                partial per chunk, and the partials (outer, chunks, inner) are reduced again the
//                same way. The chunks depend on R alone, so the order of the sum does not depend
//                on the GPU or the launch.
// max and argmax follow the CPU: NaN is the maximum, argmax returns the first maximum.
#include <algorithm>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

constexpr int64_t kChunk = 16384;

// sum, and max with NaN winning (the CPU's max_row: NaN if any element is NaN)
struct Sum {
  template <class T> __device__ static T identity() { return T(0); }
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxNan {
  template <class T> __device__ static T identity() { return lowest<T>(); }  // -inf for floats
  template <class T> __device__ T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};

// One block reduces in[row * len + r] for r in [begin, end) of each row = blockIdx.x (row_stride
// apart) into out[blockIdx.x].
template <class T, class Op>
__global__ void reduce_rows_kernel(T* out, const T* in, int64_t row_stride, int64_t len, Op op) {
  __shared__ T sh[kThreads];
  const T* x = in + int64_t(blockIdx.x) * row_stride;
  const int64_t n = min(len, row_stride);  // the last chunk of a split row is shorter
  T acc = Op::template identity<T>();
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) acc = op(acc, x[r]);
  acc = block_reduce(acc, op, sh);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

// The chunked first pass of a single long row: block k reduces in[k * kChunk, (k + 1) * kChunk).
template <class T, class Op>
__global__ void reduce_chunks_kernel(T* partial, const T* in, int64_t R, Op op) {
  __shared__ T sh[kThreads];
  const int64_t b = int64_t(blockIdx.x) * kChunk, e = min(R, b + kChunk);
  T acc = Op::template identity<T>();
  for (int64_t r = b + threadIdx.x; r < e; r += blockDim.x) acc = op(acc, in[r]);
  acc = block_reduce(acc, op, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <class T, class Op>
__global__ void reduce_columns_kernel(T* out, const T* in, int64_t outer, int64_t R, int64_t inner, Op op) {
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < outer * inner;
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = w / inner, i = w % inner;
    const T* x = in + o * R * inner + i;
    T acc = Op::template identity<T>();
    for (int64_t r = 0; r < R; ++r) acc = op(acc, x[r * inner]);
    out[w] = acc;
  }
}

constexpr int64_t kWideOutputs = 131072;  // outputs enough to fill the GPU with one thread each
constexpr int64_t kColChunk = 512;        // rows of one partial sum in the chunked column pass
constexpr int kColTile = 32;              // columns of one block (a warp: coalesced reads)
constexpr int kRowLanes = kThreads / kColTile;

// Block-items (o, chunk, column tile), grid-stride: rows [chunk * kColChunk, + kColChunk) of columns
// [tile * 32, + 32) of slice o, into part[(o * chunks + chunk) * inner + i].
template <class T, class Op>
__global__ void reduce_column_chunks_kernel(T* part, const T* in, int64_t outer, int64_t R, int64_t inner, Op op) {
  __shared__ T sh[kRowLanes][kColTile + 1];
  const int64_t chunks = (R + kColChunk - 1) / kColChunk, tiles = (inner + kColTile - 1) / kColTile;
  const int tx = int(threadIdx.x) % kColTile, ty = int(threadIdx.x) / kColTile;
  for (int64_t item = blockIdx.x; item < outer * chunks * tiles; item += gridDim.x) {
    const int64_t tile = item % tiles, chunk = (item / tiles) % chunks, o = item / (tiles * chunks);
    const int64_t i = tile * kColTile + tx, r0 = chunk * kColChunk, r1 = min(R, r0 + kColChunk);
    T acc = Op::template identity<T>();
    if (i < inner) {
      const T* x = in + o * R * inner + i;
      for (int64_t r = r0 + ty; r < r1; r += kRowLanes) acc = op(acc, x[r * inner]);
    }
    sh[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && i < inner) {
      for (int l = 1; l < kRowLanes; ++l) acc = op(acc, sh[l][tx]);
      part[(o * chunks + chunk) * inner + i] = acc;
    }
    __syncthreads();  // sh is rewritten by the next item
  }
}

template <class T, class Op>
void reduce(T* out, const T* in, int64_t outer, int64_t R, int64_t inner, Op op);

// (outer, R, inner) -> (outer, inner) with inner > 1, one of the two ways described at the top.
template <class T, class Op>
void reduce_columns(T* out, const T* in, int64_t outer, int64_t R, int64_t inner, Op op) {
  if (outer * inner >= kWideOutputs || R <= kColChunk / 8) {
    reduce_columns_kernel<<<blocks_for(outer * inner), kThreads, 0, stream()>>>(out, in, outer, R, inner, op);
    kernelCheck();
    return;
  }
  const int64_t chunks = (R + kColChunk - 1) / kColChunk, tiles = (inner + kColTile - 1) / kColTile;
  const unsigned grid = unsigned(std::min<int64_t>(outer * chunks * tiles, int64_t(1) << 20));
  if (chunks == 1) {  // the partials are the result
    reduce_column_chunks_kernel<<<grid, kThreads, 0, stream()>>>(out, in, outer, R, inner, op);
    kernelCheck();
    return;
  }
  Scratch part(size_t(outer * chunks * inner) * sizeof(T));
  reduce_column_chunks_kernel<<<grid, kThreads, 0, stream()>>>(part.as<T>(), in, outer, R, inner, op);
  kernelCheck();
  reduce(out, part.as<T>(), outer, chunks, inner, op);  // the chunks' partials, in chunk order
}

template <class T, class Op>
void reduce(T* out, const T* in, int64_t outer, int64_t R, int64_t inner, Op op) {
  if (outer * inner == 0) return;
  if (inner == 1 && outer == 1 && R > kChunk) {
    const int64_t nchunk = (R + kChunk - 1) / kChunk;
    Scratch partial(size_t(nchunk) * sizeof(T));
    reduce_chunks_kernel<<<unsigned(nchunk), kThreads, 0, stream()>>>(partial.as<T>(), in, R, op);
    kernelCheck();
    reduce_rows_kernel<<<1, kThreads, 0, stream()>>>(out, partial.as<T>(), nchunk, nchunk, op);
    kernelCheck();
    return;
  }
  if (inner == 1) {
    reduce_rows_kernel<<<unsigned(outer), kThreads, 0, stream()>>>(out, in, R, R, op);
    kernelCheck();
    return;
  }
  reduce_columns(out, in, outer, R, inner, op);
}

// (value, index) of the first maximum, NaN counting as the maximum: b replaces a when it is
// larger, or NaN where a is not, or equal with a smaller index (the tree may meet them out of order).
template <class T>
__device__ inline bool argmax_takes(T a, int64_t ia, T b, int64_t ib) {
  const bool an = a != a, bn = b != b;
  if (an || bn) return bn && (!an || ib < ia);
  return b > a || (b == a && ib < ia);
}

template <class T>
__global__ void argmax_rows_kernel(int64_t* out, const T* in, int64_t R) {
  __shared__ T sv[kThreads];
  __shared__ int64_t si[kThreads];
  const T* x = in + int64_t(blockIdx.x) * R;
  const int t = threadIdx.x;
  T m = x[0];
  int64_t best = 0;
  for (int64_t r = t; r < R; r += blockDim.x)
    if (argmax_takes(m, best, x[r], r)) m = x[r], best = r;
  sv[t] = m;
  si[t] = best;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (t < s && argmax_takes(sv[t], si[t], sv[t + s], si[t + s])) sv[t] = sv[t + s], si[t] = si[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = si[0];
}

// the CPU's loop, one thread per column
template <class T>
__global__ void argmax_columns_kernel(int64_t* out, const T* in, int64_t outer, int64_t R, int64_t inner) {
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < outer * inner;
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = w / inner, i = w % inner;
    const T* x = in + o * R * inner + i;
    int64_t best = 0;
    T m = x[0];
    for (int64_t r = 1; r < R; ++r) {
      const T v = x[r * inner];
      if (m != m) break;  // a NaN is the maximum
      if (v > m || v != v) m = v, best = r;
    }
    out[w] = best;
  }
}

}  // namespace

template <class T>
void sum_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner) {
  reduce(out, in, outer, R, inner, Sum{});
}

template <class T>
void max_forward(T* out, const T* in, int64_t outer, int64_t R, int64_t inner) {
  reduce(out, in, outer, R, inner, MaxNan{});
}

template <class T>
void argmax_forward(int64_t* out, const T* in, int64_t outer, int64_t R, int64_t inner) {
  if (outer * inner == 0 || R == 0) return;
  if (inner == 1) {
    argmax_rows_kernel<<<unsigned(outer), kThreads, 0, stream()>>>(out, in, R);
  } else {
    argmax_columns_kernel<<<blocks_for(outer * inner), kThreads, 0, stream()>>>(out, in, outer, R, inner);
  }
  kernelCheck();
}

// The kernels of core/kernels/reduce.h for the dtypes listed there.
AG_INSTANTIATE_REDUCE_KERNELS

}  // namespace ag::cuda
