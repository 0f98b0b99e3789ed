#pragma once
// The kernels of softplus (math: softplus.h), the CPU and CUDA versions declared side by side so
// a signature mismatch shows. Plain C++ only: nvcc compiles this header for softplus.cu.
//   inp, out (N)     x and y, flattened (contiguous)
//   dinp, dout (N)   their gradients
// Overloads for float (f32) and double (f64).
#include <cstdint>

namespace ext {

// snippet-begin: kernels
namespace cpu {
void softplus_forward(float* out, const float* inp, int64_t N, double beta, double threshold);
void softplus_forward(double* out, const double* inp, int64_t N, double beta, double threshold);
void softplus_backward(float* dinp, const float* dout, const float* inp, int64_t N, double beta, double threshold);
void softplus_backward(double* dinp, const double* dout, const double* inp, int64_t N, double beta,
                       double threshold);
}  // namespace cpu

// The same arguments after the index of the GPU that holds the pointers. Defined in softplus.cu,
// which is compiled only when attograd was built with CUDA (ATTOGRAD_WITH_CUDA).
namespace cuda {
void softplus_forward(int device, float* out, const float* inp, int64_t N, double beta, double threshold);
void softplus_forward(int device, double* out, const double* inp, int64_t N, double beta, double threshold);
void softplus_backward(int device, float* dinp, const float* dout, const float* inp, int64_t N, double beta,
                       double threshold);
void softplus_backward(int device, double* dinp, const double* dout, const double* inp, int64_t N, double beta,
                       double threshold);
}  // namespace cuda

// Raises ag::Error for a failed CUDA call (defined in softplus.cpp: .cu files do not see fmt or
// ag::Error, as in attograd's own cuda/).
[[noreturn]] void raise_cuda_error(const char* kernel, const char* what);
// snippet-end: kernels

}  // namespace ext
