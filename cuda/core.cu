// GPU kernels of the tensor core, the twins of core/cpu/core.cpp. Shapes and contracts:
// core/kernels/core.h.
//
// The random kernels give the CPU's numbers: the same counters, the same transforms, and the same
// roundings: each multiply-add is one fma on both sides (core/cpu/core.cpp writes std::fma), every
// other product one mul_rn (never contracted by nvcc).
#include <cmath>

#include "cuda/loops.cuh"

namespace ag::cuda {

namespace {

template <class To, class From>
__global__ void cast_copy_kernel(To* dst, const From* src, Plan<1> p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[1];
    plan_offsets(p, i, off);
    dst[i] = storage_cast<To>(src[off[0]]);
  }
}

// plan over {dst, src}: both strided
template <class T>
__global__ void strided_copy_kernel(T* dst, const T* src, Plan<2> p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    plan_offsets(p, i, off);
    dst[off[0]] = src[off[1]];
  }
}

template <class T>
__global__ void fill_kernel(T* dst, Plan<1> p, T value) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[1];
    plan_offsets(p, i, off);
    dst[off[0]] = value;
  }
}

template <class T>
__global__ void arange_kernel(T* dst, int64_t n, double start, double step) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = static_cast<T>(fma(double(i), step, start));
}

// One thread per Philox block c (4 elements).
template <class T>
__global__ void uniform_kernel(T* dst, int64_t n, uint64_t seed, uint64_t offset, double low, double high) {
  const double span = high - low;
  const int64_t blocks = (n + 3) / 4;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < blocks; c += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 r = philox4x32_10(seed, offset + uint64_t(c));
    for (int j = 0; j < 4 && c * 4 + j < n; ++j) {
      const T v = T(fma(span, double(uniform01(r.v[j])), low));
      dst[c * 4 + j] = v < T(high) ? v : std::nextafter(T(high), T(low));  // half-open, as the CPU
    }
  }
}

// Box-Muller on lanes (0,1) and (2,3), in double as on the CPU.
template <class T>
__global__ void normal_kernel(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < blocks; c += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 r = philox4x32_10(seed, offset + uint64_t(c));
    double z[4];
    for (int q = 0; q < 2; ++q) {
      const double u1 = 1.0 - double(uniform01(r.v[2 * q]));  // (0, 1]: log is finite
      const double u2 = double(uniform01(r.v[2 * q + 1]));
      const double rad = ::sqrt(mul_rn(-2.0, ::log(u1)));
      const double th = mul_rn(mul_rn(2.0, M_PI), u2);
      z[2 * q] = mul_rn(rad, ::cos(th));
      z[2 * q + 1] = mul_rn(rad, ::sin(th));
    }
    for (int j = 0; j < 4 && c * 4 + j < n; ++j) dst[c * 4 + j] = T(fma(std, z[j], mean));
  }
}

__global__ void randint_kernel(int64_t* dst, int64_t n, uint64_t seed, uint64_t offset, int64_t low, uint64_t range) {
  const int64_t blocks = (n + 1) / 2;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < blocks; c += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 r = philox4x32_10(seed, offset + uint64_t(c));
    for (int j = 0; j < 2 && c * 2 + j < n; ++j) {
      const uint64_t x = (uint64_t(r.v[2 * j]) << 32) | r.v[2 * j + 1];
      dst[c * 2 + j] = int64_t(uint64_t(low) + x % range);
    }
  }
}

}  // namespace

template <class To, class From>
void cast_copy(To* dst, const From* src, const Layout& src_layout) {
  const Layout* const in[1] = {&src_layout};
  const Plan<1> p = make_plan<1>(in);
  if (p.n == 0) return;
  cast_copy_kernel<<<blocks_for(p.n), kThreads, 0, stream()>>>(dst, src, p);
  kernelCheck();
}

template <class T>
void strided_copy(T* dst, const Layout& dst_layout, const T* src, const Layout& src_layout) {
  if (dst_layout.is_contiguous()) return cast_copy<T, T>(dst, src, src_layout);
  const Layout* const in[2] = {&dst_layout, &src_layout};
  const Plan<2> p = make_plan<2>(in);
  if (p.n == 0) return;
  strided_copy_kernel<<<blocks_for(p.n), kThreads, 0, stream()>>>(dst, src, p);
  kernelCheck();
}

template <class T>
void fill(T* dst, const Layout& dst_layout, T value) {
  const Layout* const in[1] = {&dst_layout};
  const Plan<1> p = make_plan<1>(in);
  if (p.n == 0) return;
  fill_kernel<<<blocks_for(p.n), kThreads, 0, stream()>>>(dst, p, value);
  kernelCheck();
}

template <class T>
void arange(T* dst, int64_t n, double start, double step) {
  if (n <= 0) return;
  arange_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(dst, n, start, step);
  kernelCheck();
}

template <class T>
void uniform(T* dst, int64_t n, uint64_t seed, uint64_t offset, double low, double high) {
  if (n <= 0) return;
  uniform_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream()>>>(dst, n, seed, offset, low, high);
  kernelCheck();
}

template <class T>
void normal(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) {
  if (n <= 0) return;
  normal_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream()>>>(dst, n, seed, offset, mean, std);
  kernelCheck();
}

void randint(int64_t* dst, int64_t n, uint64_t seed, uint64_t offset, int64_t low, int64_t high) {
  if (n <= 0) return;
  const uint64_t range = uint64_t(high) - uint64_t(low);
  randint_kernel<<<blocks_for((n + 1) / 2), kThreads, 0, stream()>>>(dst, n, seed, offset, low, range);
  kernelCheck();
}

// The kernels of core/kernels/core.h for the dtypes listed there.
AG_INSTANTIATE_CORE_KERNELS

}  // namespace ag::cuda
