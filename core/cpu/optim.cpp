// Optimizer kernels on the CPU. Shapes and contracts: core/kernels/optim.h. Rules: optim/sgd.h,
// optim/adam.h, optim/clip.h.
//
// Each update is one pass over the parameter: every element reads its p, g and state once and
// writes them once (PyTorch 1.13's for-loop implementation makes 5-7 passes of separate ops).
// The per-element arithmetic follows PyTorch's op order, with the scalars cast to T as PyTorch
// casts them, so f32 results agree with torch.optim to rounding. The list is one parallel loop
// over the elements of all its tensors laid end to end (for_each_piece), so a model of many small
// tensors forks the threads once per step, not once per tensor; every element's arithmetic is the
// same wherever the cut falls, so the bits do not depend on the thread count or on the list.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/kernels.h"
#include "core/parallel.h"

namespace ag::cpu {

namespace {
// body(k, b, e) over the pieces [b, e) of tensor k that one parallel loop over the concatenated
// elements of ts[0 .. count) hands to each thread.
template <class Item, class F>
void for_each_piece(const Item* ts, int64_t count, F&& body) {
  std::vector<int64_t> start(size_t(count) + 1, 0);  // tensor k is [start[k], start[k + 1])
  for (int64_t k = 0; k < count; ++k) start[size_t(k) + 1] = start[size_t(k)] + ts[k].n;
  parallel_for_elements(start.back(), kGrain, [&](int64_t b, int64_t e) {
    // the last tensor that starts at or before b (skipping empty ones)
    int64_t k = int64_t(std::upper_bound(start.begin(), start.end(), b) - start.begin()) - 1;
    for (; k < count && start[size_t(k)] < e; ++k) {
      const int64_t lo = std::max(b, start[size_t(k)]), hi = std::min(e, start[size_t(k) + 1]);
      if (lo < hi) body(k, lo - start[size_t(k)], hi - start[size_t(k)]);
    }
  });
}
}  // namespace

// SGD, torch.optim.SGD: the rule of optim/sgd.h. Without momentum the buffer is never read or
// written.
template <class T>
void sgd_update(const SgdTensor<T>* ts, int64_t count, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov) {
  const T wd = T(weight_decay), mu = T(momentum), damp = T(1 - dampening), neg_lr = T(-lr);
  const bool use_momentum = momentum != 0;
  for_each_piece(ts, count, [&](int64_t k, int64_t b, int64_t e) {
    T* param = ts[k].param;
    T* buf = ts[k].buf;
    const T* grad = ts[k].grad;
    const bool first = ts[k].first;
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

// Adam / AdamW, torch.optim.Adam and torch.optim.AdamW 1.13: the rule of optim/adam.h (derived in
// docs/math/adam.md), in PyTorch's op order: denom = sqrt(v) / sqrt(1 - beta2^t) + eps, then
// p <- p - lr / (1 - beta1^t) * m / denom, with eps added after the bias correction.
template <class T>
void adam_update(const AdamTensor<T>* ts, int64_t count, double lr, double beta1, double beta2, double eps,
                 double weight_decay, bool decoupled) {
  const T decay = T(1 - lr * weight_decay), l2 = T(decoupled ? 0 : weight_decay);
  const T b1 = T(beta1), one_minus_b1 = T(1 - beta1), b2 = T(beta2), one_minus_b2 = T(1 - beta2), e_ps = T(eps);
  // the step's scalars of each tensor in double, as PyTorch computes them in Python, then cast once
  std::vector<T> bc2(static_cast<size_t>(count)), neg_step_size(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    const double bias_correction1 = 1 - std::pow(beta1, double(ts[k].step));
    bc2[size_t(k)] = T(std::sqrt(1 - std::pow(beta2, double(ts[k].step))));
    neg_step_size[size_t(k)] = T(-lr / bias_correction1);
  }
  for_each_piece(ts, count, [&](int64_t k, int64_t b, int64_t e) {
    T* param = ts[k].param;
    T* exp_avg = ts[k].exp_avg;
    T* exp_avg_sq = ts[k].exp_avg_sq;
    const T* grad = ts[k].grad;
    const T bc2_k = bc2[size_t(k)], neg_step_size_k = neg_step_size[size_t(k)];
    // snippet-begin: adam-update
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      T p = param[i];
      if (decoupled) p = p * decay;
      const T g = grad[i] + l2 * p;
      const T m = b1 * exp_avg[i] + one_minus_b1 * g;
      const T v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
      const T denom = std::sqrt(v) / bc2_k + e_ps;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      param[i] = p + neg_step_size_k * m / denom;
    }
    // snippet-end: adam-update
  });
}

namespace {
// Fixed block of the norm: the partial sums (and so the result) never depend on threads.
constexpr int64_t kNormBlock = 16384;

// snippet-begin: grad-norm-partial
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
// snippet-end: grad-norm-partial
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

// out[k] = sum_i |x_ki|^p  (the p-norm is the p-th root of the sum over all tensors, taken by the
//          caller), or
// out[k] = max_i |x_ki|    when p = inf.
// Each tensor is cut into blocks of kNormBlock elements fixed by its size; all the blocks of all
// the tensors are reduced in one parallel loop, then each tensor's partials are combined in order.
template <class T>
void grad_norm_partial(double* out, const TensorSpan<T>* xs, int64_t count, double p) {
  const bool inf = std::isinf(p);
  struct Block {
    int64_t k, b, e;
  };
  std::vector<Block> blocks;
  for (int64_t k = 0; k < count; ++k)
    for (int64_t b = 0; b < xs[k].n; b += kNormBlock) blocks.push_back({k, b, std::min(xs[k].n, b + kNormBlock)});
  std::vector<double> partial(blocks.size());
  parallel_for(int64_t(blocks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      const Block& bl = blocks[size_t(j)];
      const T* x = xs[bl.k].data + bl.b;
      partial[size_t(j)] = inf ? abs_max(x, bl.e - bl.b) : abs_pow_sum(x, bl.e - bl.b, p);
    }
  });
  for (int64_t k = 0; k < count; ++k) out[k] = 0;
  std::vector<bool> nan(size_t(count), false);
  for (size_t j = 0; j < blocks.size(); ++j) {
    const double v = partial[j];
    double& acc = out[blocks[j].k];
    nan[size_t(blocks[j].k)] = nan[size_t(blocks[j].k)] || v != v;
    acc = inf ? (v > acc ? v : acc) : acc + v;
  }
  for (int64_t k = 0; k < count; ++k)
    if (nan[size_t(k)]) out[k] = std::numeric_limits<double>::quiet_NaN();
}

// x <- x * factor (the factor cast to T, as Tensor::mul_ casts a scalar)
// snippet-begin: scale-inplace
template <class T>
void scale_inplace(const TensorSpan<T>* xs, int64_t count, double factor) {
  const T f = T(factor);
  for_each_piece(xs, count, [&](int64_t k, int64_t b, int64_t e) {
    T* x = xs[k].data;
#pragma omp simd
    for (int64_t i = b; i < e; ++i) x[i] = x[i] * f;
  });
}
// snippet-end: scale-inplace

// x <- clamp(x, -clip, clip), NaN kept (torch.clamp_)
template <class T>
void clip_value(const TensorSpan<T>* xs, int64_t count, double clip) {
  const T hi = T(clip), lo = T(-clip);
  for_each_piece(xs, count, [&](int64_t k, int64_t b, int64_t e) {
    T* x = xs[k].data;
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const T v = x[i];
      x[i] = v != v ? v : (v < lo ? lo : (v > hi ? hi : v));
    }
  });
}

// The kernels of core/kernels/optim.h for the dtypes listed there.
AG_INSTANTIATE_OPTIM_KERNELS

}  // namespace ag::cpu
