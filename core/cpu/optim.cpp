// Optimizer kernels (core/kernels/optim.h). Rules: optim/sgd.h, optim/adam.h, optim/clip.h.
// param, grad, buf, exp_avg, exp_avg_sq, x: (N) contiguous, N = the parameter's numel.
//
// Each update is one pass over the parameter: every element reads its p, g and state once and
// writes them once (PyTorch 1.13's for-loop implementation makes 5-7 passes of separate ops).
// The per-element arithmetic follows PyTorch's op order, with the scalars cast to T as PyTorch
// casts them, so f32 results agree with torch.optim to rounding.
#include <cmath>
#include <limits>
#include <vector>

#include "core/kernels.h"
#include "core/parallel.h"

namespace ag::cpu {

// SGD, torch.optim.SGD (momentum mu, dampening tau, weight decay wd, learning rate lr):
//   g <- g + wd * p
//   b <- g                              at the first step
//   b <- mu * b + (1 - tau) * g         after it
//   g <- g + mu * b  (nesterov)   or   g <- b  (plain momentum)
//   p <- p - lr * g
// Without momentum the buffer is never read or written: p <- p - lr * (g + wd * p).
template <class T>
void sgd_update(T* param, T* buf, const T* grad, int64_t n, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov, bool first) {
  const T wd = T(weight_decay), mu = T(momentum), damp = T(1 - dampening), neg_lr = T(-lr);
  const bool use_momentum = momentum != 0;
  parallel_for_elements(n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      T g = grad[i] + wd * param[i];
      if (use_momentum) {
        T m = first ? g : mu * buf[i] + damp * g;
        buf[i] = m;
        g = nesterov ? g + mu * m : m;
      }
      param[i] = param[i] + neg_lr * g;
    }
  });
}

// Adam / AdamW, torch.optim.Adam and torch.optim.AdamW 1.13, t = step (1 at the first update):
//   p <- p * (1 - lr * wd)                         AdamW only (decoupled weight decay)
//   g <- g + wd * p                                Adam only (L2 weight decay)
//   m <- beta1 * m + (1 - beta1) * g               exp_avg: running mean of g
//   v <- beta2 * v + (1 - beta2) * g * g           exp_avg_sq: running mean of g^2
//   denom     = sqrt(v) / sqrt(1 - beta2^t) + eps  (v / (1 - beta2^t) is v without its bias to 0)
//   step_size = lr / (1 - beta1^t)                 (the same for m)
//   p <- p - step_size * m / denom
// so p moves by lr * m_hat / (sqrt(v_hat) + eps), with eps added after the bias correction.
template <class T>
void adam_update(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t n, double lr, double beta1,
                 double beta2, double eps, double weight_decay, bool decoupled, int64_t step) {
  // the scalars in double, as PyTorch computes them in Python, then cast once
  const double bias_correction1 = 1 - std::pow(beta1, double(step));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, double(step)));
  const T decay = T(1 - lr * weight_decay), l2 = T(decoupled ? 0 : weight_decay);
  const T b1 = T(beta1), one_minus_b1 = T(1 - beta1), b2 = T(beta2), one_minus_b2 = T(1 - beta2);
  const T bc2 = T(bias_correction2_sqrt), e_ps = T(eps), neg_step_size = T(-lr / bias_correction1);
  parallel_for_elements(n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      T p = param[i];
      if (decoupled) p = p * decay;
      const T g = grad[i] + l2 * p;
      const T m = b1 * exp_avg[i] + one_minus_b1 * g;
      const T v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
      const T denom = std::sqrt(v) / bc2 + e_ps;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      param[i] = p + neg_step_size * m / denom;
    }
  });
}

namespace {
// Fixed block of the norm: the partial sums (and so the result) never depend on threads.
constexpr int64_t kNormBlock = 16384;

template <class T>
double abs_pow_sum(const T* x, int64_t n, double p) {
  double acc = 0;
  if (p == 2) {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
  } else if (p == 1) {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += std::abs(double(x[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) acc += std::pow(std::abs(double(x[i])), p);
  }
  return acc;
}
template <class T>
double abs_max(const T* x, int64_t n) {
  double m = 0;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::abs(double(x[i]));
    nan |= a != a;
    m = a > m ? a : m;
  }
  return nan ? std::numeric_limits<double>::quiet_NaN() : m;
}
}  // namespace

// out = sum_i |x_i|^p  (the p-norm is out^(1/p), taken by the caller over all tensors), or
// out = max_i |x_i|    when p = inf.
template <class T>
void grad_norm_partial(double* out, const T* x, int64_t n, double p) {
  const bool inf = std::isinf(p);
  const std::vector<double> partial = parallel_blocks<double>(n, kNormBlock, [&](int64_t b, int64_t e) {
    return inf ? abs_max(x + b, e - b) : abs_pow_sum(x + b, e - b, p);
  });
  double acc = 0;
  bool nan = false;
  for (double v : partial) {
    nan |= v != v;
    acc = inf ? (v > acc ? v : acc) : acc + v;
  }
  *out = nan ? std::numeric_limits<double>::quiet_NaN() : acc;
}

// x <- clamp(x, -clip, clip), NaN kept (torch.clamp_)
template <class T>
void clip_value(T* x, int64_t n, double clip) {
  const T hi = T(clip), lo = T(-clip);
  parallel_for_elements(n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const T v = x[i];
      x[i] = v != v ? v : (v < lo ? lo : (v > hi ? hi : v));
    }
  });
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

}  // namespace ag::cpu
