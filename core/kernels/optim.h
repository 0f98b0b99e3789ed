#pragma once
// Optimizer kernels: one fused loop per parameter tensor. The update rules are written in math
// above each optimizer (optim/sgd.h, optim/adam.h) and again above each kernel (core/cpu/optim.cpp).
// Every pointer is a contiguous buffer of n elements, the shape of the parameter; scalars are the
// optimizer's hyper-parameters (double, cast to T as PyTorch casts a Python float for the tensor).
#include <cstdint>

namespace ag::cpu {

// torch.optim.SGD on one parameter. `first` says the momentum buffer is fresh (b <- g); buf is
// unused (may be null) when momentum == 0.
template <class T>
void sgd_update(T* param, T* buf, const T* grad, int64_t n, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov, bool first);
// torch.optim.Adam (decoupled = false) and torch.optim.AdamW (decoupled = true) on one parameter,
// `step` counting this update (1 at the first).
template <class T>
void adam_update(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t n, double lr, double beta1,
                 double beta2, double eps, double weight_decay, bool decoupled, int64_t step);
// out[0] = sum_i |x_i|^p in double, or max_i |x_i| when p is +inf (NaN when any x_i is NaN).
// Fixed blocks summed in order: the result does not depend on the thread count.
template <class T>
void grad_norm_partial(double* out, const T* x, int64_t n, double p);
// x_i <- min(max(x_i, -clip), clip); NaN stays NaN.
template <class T>
void clip_value(T* x, int64_t n, double clip);

}  // namespace ag::cpu

// The same on the GPU (cuda/optim.cu). grad_norm_partial writes its double to device memory (out
// is on the GPU) with no host round trip: the caller reads all the partials back at once.
namespace ag::cuda {

template <class T>
void sgd_update(T* param, T* buf, const T* grad, int64_t n, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov, bool first);
template <class T>
void adam_update(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t n, double lr, double beta1,
                 double beta2, double eps, double weight_decay, bool decoupled, int64_t step);
template <class T>
void grad_norm_partial(double* out, const T* x, int64_t n, double p);
template <class T>
void clip_value(T* x, int64_t n, double clip);

}  // namespace ag::cuda
