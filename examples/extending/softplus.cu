// softplus on a GPU (math: softplus.h). Compiled only when attograd was built with CUDA.
//   inp, out (N)     x and y, flattened (contiguous), in the memory of GPU `device`
//   dinp, dout (N)   their gradients
// One thread per element; the math is that of softplus_cpu.cpp, line for line. Launched on
// attograd's stream of the device (ag::cuda::stream, cuda/memory.h), as attograd's own kernels are.
#include <cuda_runtime.h>

#include "cuda/memory.h"  // ag::cuda::set_device, ag::cuda::stream: plain C++, no tensor headers
#include "softplus_kernels.h"

namespace ext::cuda {

namespace {

// snippet-begin: cuda
template <class T>
__global__ void softplus_forward_kernel(T* out, const T* inp, int64_t N, T b, T th) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const T z = b * inp[i];
  // max(z, 0) + log1p(e^-|z|) = log(1 + e^z), without overflow (softplus_cpu.cpp)
  out[i] = z > th ? inp[i] : (max(z, T(0)) + log1p(exp(-fabs(z)))) / b;
}

template <class T>
__global__ void softplus_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t N, T b, T th) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const T z = b * inp[i];
  // dy/dx = sigmoid(z), 1 past the threshold (softplus_cpu.cpp)
  const T local = z > th ? T(1) : T(1) / (T(1) + exp(-z));
  dinp[i] = local * dout[i];
}

// Every CUDA call is checked; a launch is checked with cudaGetLastError, as llm.c does.
void check(cudaError_t err, const char* kernel) {
  if (err != cudaSuccess) raise_cuda_error(kernel, cudaGetErrorString(err));
}

constexpr int kBlock = 256;
int blocks(int64_t N) { return int((N + kBlock - 1) / kBlock); }

// The stream to launch on: attograd's own for this device. attograd queues all the work of a GPU
// on one non-blocking stream, so its kernels are ordered by that stream alone, and its caching
// allocator hands a freed block to the next allocation at once, ordered by that stream too. A
// kernel on any other stream (the legacy default one of a bare <<<...>>> included: a non-blocking
// stream does not wait for it, nor it for that one) could read inp before the op that writes it
// has run, or write out while the block is still being read by an op that freed it: a data race.
// set_device, not cudaSetDevice: attograd remembers which device it made current.
cudaStream_t stream_of(int device) {
  ag::cuda::set_device(device);
  return static_cast<cudaStream_t>(ag::cuda::stream(device));
}

template <class T>
void forward(int device, T* out, const T* inp, int64_t N, double beta, double threshold) {
  if (N == 0) return;
  softplus_forward_kernel<<<blocks(N), kBlock, 0, stream_of(device)>>>(out, inp, N, T(beta), T(threshold));
  check(cudaGetLastError(), "softplus_forward");
}

template <class T>
void backward(int device, T* dinp, const T* dout, const T* inp, int64_t N, double beta, double threshold) {
  if (N == 0) return;
  softplus_backward_kernel<<<blocks(N), kBlock, 0, stream_of(device)>>>(dinp, dout, inp, N, T(beta), T(threshold));
  check(cudaGetLastError(), "softplus_backward");
}
// snippet-end: cuda

}  // namespace

void softplus_forward(int device, float* out, const float* inp, int64_t N, double beta, double threshold) {
  forward(device, out, inp, N, beta, threshold);
}
void softplus_forward(int device, double* out, const double* inp, int64_t N, double beta, double threshold) {
  forward(device, out, inp, N, beta, threshold);
}
void softplus_backward(int device, float* dinp, const float* dout, const float* inp, int64_t N, double beta,
                       double threshold) {
  backward(device, dinp, dout, inp, N, beta, threshold);
}
void softplus_backward(int device, double* dinp, const double* dout, const double* inp, int64_t N, double beta,
                       double threshold) {
  backward(device, dinp, dout, inp, N, beta, threshold);
}

}  // namespace ext::cuda
