// softplus on the CPU (math: softplus.h).
//   inp, out (N)     x and y, flattened (contiguous)
//   dinp, dout (N)   their gradients
// One plain loop each, written like llm.c's kernels: raw pointers and a size, outputs first.
// (attograd's own pointwise ops run through a shared engine, core/cpu/loops.h, that also splits
// the loop over threads; a one-thread loop keeps this example short.)
#include <algorithm>
#include <cmath>

#include "softplus_kernels.h"

namespace ext::cpu {

namespace {

// snippet-begin: cpu
template <class T>
void forward(T* out, const T* inp, int64_t N, double beta, double threshold) {
  const T b = T(beta), th = T(threshold);
  for (int64_t i = 0; i < N; i++) {
    const T z = b * inp[i];
    // log(1 + e^z) = max(z, 0) + log1p(e^-|z|): for z >= 0 factor e^z out of the log,
    // log(e^z (e^-z + 1)) = z + log1p(e^-z); for z < 0 it is log1p(e^z) as written. e^-|z| <= 1,
    // so nothing overflows, and log1p keeps the digits that log(1 + tiny) would round away.
    // Past the threshold PyTorch returns x itself (the two differ by log1p(e^-z)/beta < 2.1e-9/beta
    // at the default threshold 20).
    out[i] = z > th ? inp[i] : (std::max(z, T(0)) + std::log1p(std::exp(-std::abs(z)))) / b;
  }
}

template <class T>
void backward(T* dinp, const T* dout, const T* inp, int64_t N, double beta, double threshold) {
  const T b = T(beta), th = T(threshold);
  for (int64_t i = 0; i < N; i++) {
    const T z = b * inp[i];
    // in the forward pass this was:  y = log(1 + e^z) / beta,  z = beta x
    // so now we have:  dy/dx = (1/beta) * e^z / (1 + e^z) * beta = 1 / (1 + e^-z) = sigmoid(z)
    // (beta cancels). For z -> -inf, e^-z overflows to inf and the sigmoid to its limit 0.
    // Where the forward returned x, dy/dx = 1.
    // dinp is written, not accumulated: it is a fresh tensor, and the tape adds the gradients
    // of an input used twice.
    const T local = z > th ? T(1) : T(1) / (T(1) + std::exp(-z));
    dinp[i] = local * dout[i];
  }
}
// snippet-end: cpu

}  // namespace

void softplus_forward(float* out, const float* inp, int64_t N, double beta, double threshold) {
  forward(out, inp, N, beta, threshold);
}
void softplus_forward(double* out, const double* inp, int64_t N, double beta, double threshold) {
  forward(out, inp, N, beta, threshold);
}
void softplus_backward(float* dinp, const float* dout, const float* inp, int64_t N, double beta, double threshold) {
  backward(dinp, dout, inp, N, beta, threshold);
}
void softplus_backward(double* dinp, const double* dout, const double* inp, int64_t N, double beta,
                       double threshold) {
  backward(dinp, dout, inp, N, beta, threshold);
}

}  // namespace ext::cpu
