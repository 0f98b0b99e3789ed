#pragma once
// Shared by every .cu file: the device's stream and cuBLAS handle, checked CUDA and cuBLAS calls,
// launch helpers. A failure raises ag::Error naming the call, the CUDA error string and the line.
//
// One stream per device, used by every kernel, cuBLAS call and copy of that device: work on a
// device is ordered by that stream alone, so a kernel may read what the previous one wrote with no
// synchronisation, and the host waits only when it copies a result back (cuda::copy).
// KERNEL() (core/dispatch.h) makes the tensor's device current before it calls a cuda:: kernel;
// kernels launch on stream() of the current device.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/memory.h"

namespace ag::cuda {

inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess)
    raise(std::string("cuda: ") + call + " failed: " + cudaGetErrorName(err) + " (" +
          cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
}

inline void cublas_check(cublasStatus_t st, const char* call, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS)
    raise(std::string("cublas: ") + call + " failed: " + cublasGetStatusName(st) + " (" +
          cublasGetStatusString(st) + ") at " + file + ":" + std::to_string(line));
}

int current_device();            // the device KERNEL() made current
cudaStream_t stream();           // the current device's stream (created at first use)
cublasHandle_t cublas();         // the current device's cuBLAS handle, bound to stream()
cudaStream_t stream_of(int device);  // the stream of a given device

// Blocks of `threads` covering n elements, capped for grid-stride loops.
inline unsigned blocks_for(int64_t n, int threads = 256) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 32) b = 65535LL * 32;
  return unsigned(b);
}

// Threads per block of the row kernels (one block per row) and of the elementwise kernels. A power
// of two: block_reduce halves it.
inline constexpr int kThreads = 256;

// Scratch device memory for the kernels of one call (partial sums, sorted indices), from the
// caching allocator of the current device, back to it at the end of the scope. No wait is needed
// before that: every later use of the block is queued on the same stream, after these kernels.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : device_(current_device()) {
    bytes_ = 512;
    while (bytes_ < bytes) bytes_ *= 2;  // a few size classes, so the cache hits
    ptr_ = device_alloc(device_, bytes_);
  }
  ~Scratch() { device_free(device_, ptr_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  int device_;
  size_t bytes_;
  void* ptr_;
};

// keys_out, pos_out (n) = idx (n, values in [0, V)) sorted stably, with each one's position:
// positions with equal index stay in increasing order (cuda/index.cu; the deterministic scatter-adds
// of embedding and index_select walk these runs instead of adding with atomics).
void sort_by_index(int64_t* keys_out, int64_t* pos_out, const int64_t* idx, int64_t n, int64_t V);

#if defined(__CUDACC__)
// v combined over the block by op in a fixed tree (the same order every run: no atomics), using
// sh[blockDim.x] of shared memory; every thread gets the result. blockDim.x is a power of two.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* sh) {
  const int t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (t < s) sh[t] = op(sh[t], sh[t + s]);
    __syncthreads();
  }
  const T r = sh[0];
  __syncthreads();  // sh may be reused right after
  return r;
}

struct SumOp {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
// max that skips NaN (as the CPU's row_max: NaN then reaches the result through exp)
struct MaxSkipNanOp {
  template <class T> __device__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// exp and log of the dtype (expf/logf for float: full precision, no fast-math intrinsics)
__device__ inline float dexp(float x) { return expf(x); }
__device__ inline double dexp(double x) { return exp(x); }
__device__ inline float dlog(float x) { return logf(x); }
__device__ inline double dlog(double x) { return log(x); }

// -inf (the identity of max), and the lowest int64 for the integer max
template <class T> __device__ inline T lowest();
template <> __device__ inline float lowest<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ inline double lowest<double>() { return -__longlong_as_double(0x7ff0000000000000LL); }
template <> __device__ inline int64_t lowest<int64_t>() { return int64_t(-0x7fffffffffffffffLL - 1); }

// a * b and a + b rounded once each, never contracted into an FMA by nvcc: for the kernels that
// promise the CPU's bits (random numbers, dropout), whose multiply-adds are explicit fma on both sides.
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
#endif

}  // namespace ag::cuda

#define cudaCheck(call) ::ag::cuda::cuda_check((call), #call, __FILE__, __LINE__)
#define cublasCheck(call) ::ag::cuda::cublas_check((call), #call, __FILE__, __LINE__)
// after every launch (a bad configuration is reported here; a fault in the kernel at the next sync)
#define kernelCheck() ::ag::cuda::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
