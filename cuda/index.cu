// GPU index_select, the twin of core/cpu/index.cpp, and the stable sort of indices behind the
// deterministic scatter-adds (here and in embedding's backward). Shapes and contracts:
// core/kernels/index.h. Math: autograd/ops.h (index_select).
#include <cub/device/device_radix_sort.cuh>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

__global__ void iota_kernel(int64_t* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = i;
}

// out[b, l, :] = x[b, idx[l], :], one thread per output element
template <class T>
__global__ void index_select_forward_kernel(T* out, const T* x, const int64_t* idx, int64_t B, int64_t N, int64_t L,
                                            int64_t D) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < B * L * D;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % D, bl = e / D, l = bl % L, b = bl / L;
    out[e] = x[(b * N + idx[l]) * D + k];
  }
}

// The scatter-add of the backward, each dx row summing its l in increasing order: keys/pos are
// idx sorted stably with its positions l. The block (x) at the start of a run adds the run, for
// the b of its y, with one thread per k.
template <class T>
__global__ void index_select_backward_kernel(T* dx, const T* dout, const int64_t* keys, const int64_t* pos, int64_t B,
                                             int64_t N, int64_t L, int64_t D) {
  for (int64_t p = blockIdx.x; p < L; p += gridDim.x) {
    if (p > 0 && keys[p] == keys[p - 1]) continue;  // not the start of a run
    const int64_t n = keys[p];
    for (int64_t b = blockIdx.y; b < B; b += gridDim.y)
      for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
        T acc = dx[(b * N + n) * D + k];
        for (int64_t q = p; q < L && keys[q] == n; ++q) acc += dout[(b * L + pos[q]) * D + k];
        dx[(b * N + n) * D + k] = acc;
      }
  }
}

}  // namespace

void sort_by_index(int64_t* keys_out, int64_t* pos_out, const int64_t* idx, int64_t n, int64_t V) {
  if (n == 0) return;
  Scratch iota(size_t(n) * sizeof(int64_t));
  iota_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(iota.as<int64_t>(), n);
  kernelCheck();
  // the values are in [0, V): sorting their low end_bit bits as unsigned orders them (radix sort
  // is stable, so equal keys keep their positions in increasing order)
  int end_bit = 1;
  while (end_bit < 63 && (int64_t(1) << end_bit) < V) ++end_bit;
  const uint64_t* keys_in = reinterpret_cast<const uint64_t*>(idx);
  uint64_t* keys = reinterpret_cast<uint64_t*>(keys_out);
  size_t temp_bytes = 0;
  cudaCheck(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys, iota.as<int64_t>(), pos_out, n, 0,
                                            end_bit, stream()));
  Scratch temp(temp_bytes);
  cudaCheck(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, keys, iota.as<int64_t>(), pos_out,
                                            n, 0, end_bit, stream()));
}

template <class T>
void index_select_forward(T* out, const T* x, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D) {
  if (B * L * D == 0) return;
  index_select_forward_kernel<<<blocks_for(B * L * D), kThreads, 0, stream()>>>(out, x, idx, B, N, L, D);
  kernelCheck();
}

template <class T>
void index_select_backward(T* dx, const T* dout, const int64_t* idx, int64_t B, int64_t N, int64_t L, int64_t D) {
  if (B * L * D == 0) return;
  Scratch keys(size_t(L) * sizeof(int64_t)), pos(size_t(L) * sizeof(int64_t));
  sort_by_index(keys.as<int64_t>(), pos.as<int64_t>(), idx, L, N);
  const dim3 grid(unsigned(L < 65535 * 32 ? L : 65535 * 32), unsigned(B < 65535 ? B : 65535));
  index_select_backward_kernel<<<grid, kThreads, 0, stream()>>>(dx, dout, keys.as<int64_t>(), pos.as<int64_t>(), B, N,
                                                                L, D);
  kernelCheck();
}

// The kernels of core/kernels/index.h for the dtypes listed there.
AG_INSTANTIATE_INDEX_KERNELS

}  // namespace ag::cuda
