// GPU optimizer kernels (declared in core/kernels/optim.h beside the CPU ones, core/cpu/optim.cpp,
// whose update rules, written there in math, they follow op for op).
//   param, grad, buf, exp_avg, exp_avg_sq, x (n) contiguous;  out: one double in device memory
//
// sgd_update, adam_update, clip_value: one thread per element. grad_norm_partial: fixed chunks
// of kChunk elements, one block each, reduced in a fixed tree into partials, then one block over
// the partials: the same result every run (no atomics), written to device memory, so the caller
// reads the partials of all its tensors back at once.
#include "core/kernels.h"
#include "cuda/common.cuh"

namespace ag::cuda {

namespace {

constexpr int64_t kChunk = 16384;

template <class T>
__global__ void sgd_kernel(T* param, T* buf, const T* grad, int64_t n, T neg_lr, T mu, T damp, T wd, bool use_momentum,
                           bool nesterov, bool first) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    T g = grad[i] + wd * param[i];
    if (use_momentum) {
      const T m = first ? g : mu * buf[i] + damp * g;
      buf[i] = m;
      g = nesterov ? g + mu * m : m;
    }
    param[i] = param[i] + neg_lr * g;
  }
}

template <class T>
__global__ void adam_kernel(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t n, bool decoupled, T decay,
                            T l2, T b1, T one_minus_b1, T b2, T one_minus_b2, T bc2, T e_ps, T neg_step_size) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    T p = param[i];
    if (decoupled) p = p * decay;
    const T g = grad[i] + l2 * p;
    const T m = b1 * exp_avg[i] + one_minus_b1 * g;
    const T v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    const T denom = sqrt(v) / bc2 + e_ps;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p + neg_step_size * m / denom;
  }
}

// |x|^p summed (NaN propagates through the sum), or max |x| with NaN winning
struct NormSum {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct NormMax {
  __device__ double operator()(double a, double b) const { return (a != a || a > b) ? a : b; }
};

template <class T>
__device__ inline double norm_term(T x, double p) {
  const double a = fabs(double(x));
  return p == 2 ? a * a : p == 1 ? a : pow(a, p);
}

// block k reduces x[k * kChunk, (k + 1) * kChunk) into partial[k]
template <class T, class Op>
__global__ void norm_chunks_kernel(double* partial, const T* x, int64_t n, double p, bool inf, Op op) {
  __shared__ double sh[kThreads];
  const int64_t b = int64_t(blockIdx.x) * kChunk, e = min(n, b + kChunk);
  double acc = 0;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x)
    acc = op(acc, inf ? fabs(double(x[i])) : norm_term(x[i], p));
  acc = block_reduce(acc, op, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <class Op>
__global__ void norm_final_kernel(double* out, const double* partial, int64_t nchunk, Op op) {
  __shared__ double sh[kThreads];
  double acc = 0;
  for (int64_t k = threadIdx.x; k < nchunk; k += blockDim.x) acc = op(acc, partial[k]);
  acc = block_reduce(acc, op, sh);
  if (threadIdx.x == 0) *out = acc;
}

template <class T>
__global__ void clip_kernel(T* x, int64_t n, T lo, T hi) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const T v = x[i];
    x[i] = v != v ? v : (v < lo ? lo : (v > hi ? hi : v));
  }
}

__global__ void set_zero_kernel(double* out) { *out = 0; }

}  // namespace

// SGD, torch.optim.SGD: the rule is written above cpu::sgd_update.
template <class T>
void sgd_update(T* param, T* buf, const T* grad, int64_t n, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov, bool first) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(param, buf, grad, n, T(-lr), T(momentum), T(1 - dampening),
                                                       T(weight_decay), momentum != 0, nesterov, first);
  kernelCheck();
}

// Adam / AdamW, torch.optim.Adam(W): the rule is written above cpu::adam_update; the scalars are
// computed in double on the host and cast once, as there.
template <class T>
void adam_update(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t n, double lr, double beta1,
                 double beta2, double eps, double weight_decay, bool decoupled, int64_t step) {
  if (n == 0) return;
  const double bias_correction1 = 1 - std::pow(beta1, double(step));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, double(step)));
  adam_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(
      param, exp_avg, exp_avg_sq, grad, n, decoupled, T(1 - lr * weight_decay), T(decoupled ? 0 : weight_decay),
      T(beta1), T(1 - beta1), T(beta2), T(1 - beta2), T(bias_correction2_sqrt), T(eps), T(-lr / bias_correction1));
  kernelCheck();
}

template <class T>
void grad_norm_partial(double* out, const T* x, int64_t n, double p) {
  if (n == 0) {
    set_zero_kernel<<<1, 1, 0, stream()>>>(out);
    kernelCheck();
    return;
  }
  const bool inf = std::isinf(p);
  const int64_t nchunk = (n + kChunk - 1) / kChunk;
  Scratch partial(size_t(nchunk) * sizeof(double));
  if (inf) {
    norm_chunks_kernel<<<unsigned(nchunk), kThreads, 0, stream()>>>(partial.as<double>(), x, n, p, true, NormMax{});
    kernelCheck();
    norm_final_kernel<<<1, kThreads, 0, stream()>>>(out, partial.as<double>(), nchunk, NormMax{});
  } else {
    norm_chunks_kernel<<<unsigned(nchunk), kThreads, 0, stream()>>>(partial.as<double>(), x, n, p, false, NormSum{});
    kernelCheck();
    norm_final_kernel<<<1, kThreads, 0, stream()>>>(out, partial.as<double>(), nchunk, NormSum{});
  }
  kernelCheck();
}

template <class T>
void clip_value(T* x, int64_t n, double clip) {
  if (n == 0) return;
  clip_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x, n, T(-clip), T(clip));
  kernelCheck();
}

template void sgd_update<float>(float*, float*, const float*, int64_t, double, double, double, double, bool, bool);
template void adam_update<float>(float*, float*, float*, const float*, int64_t, double, double, double, double,
                                 double, bool, int64_t);
template void grad_norm_partial<float>(double*, const float*, int64_t, double);
template void clip_value<float>(float*, int64_t, double);
template void sgd_update<double>(double*, double*, const double*, int64_t, double, double, double, double, bool, bool);
template void adam_update<double>(double*, double*, double*, const double*, int64_t, double, double, double,
                                  double, double, bool, int64_t);
template void grad_norm_partial<double>(double*, const double*, int64_t, double);
template void clip_value<double>(double*, int64_t, double);

}  // namespace ag::cuda
