// Optimizer kernels, multi-tensor: one call updates a whole list of tensors of one device and
// dtype (an optimizer groups its parameters so: optim::group_by_device_and_dtype). Each element is
// read and written once; on the GPU the list goes in a few launches (each takes a table of up to a
// few dozen tensors and 320 chunks of 64K elements as its kernel parameter), not one per tensor: a
// toy model's step has ~50 small tensors and would otherwise be bound by launch latency. On the
// CPU the list is one parallel loop over all its elements, not one OpenMP region per tensor.
// The update rules are written in math above each optimizer (optim/sgd.h, optim/adam.h) and above
// clipping (optim/clip.h); the kernels point there. Every pointer is a contiguous buffer of n
// elements, the shape of its parameter; scalars are the optimizer's hyper-parameters (double,
// cast to T as PyTorch casts a Python float for the tensor).
// The parameter lists are SgdTensor, AdamTensor, TensorSpan (core/kernels.h).
//
// No include guard: core/kernels.h reads this file inside namespace ag::cpu (core/cpu/optim.cpp)
// and inside ag::cuda (cuda/optim.cu), so each kernel is declared once for both backends. On the
// GPU the lists are host arrays of device pointers, and out of grad_norm_partial is in device
// memory (no host round trip: the caller reads it back once).
#ifndef AG_KERNELS_CPU
#include "core/kernels.h"  // included on its own: the index reads this file for each backend
#else

// torch.optim.SGD on each of the `count` tensors.
template <class T>
void sgd_update(const SgdTensor<T>* ts, int64_t count, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov);
// torch.optim.Adam (decoupled = false) and torch.optim.AdamW (decoupled = true) on each tensor.
template <class T>
void adam_update(const AdamTensor<T>* ts, int64_t count, double lr, double beta1, double beta2, double eps,
                 double weight_decay, bool decoupled);
// out[k] = sum_i |x_ki|^p in double for each tensor k, or max_i |x_ki| when p is +inf (NaN when any
// x_ki is NaN; 0 for an empty one). Fixed blocks summed in order: the result does not depend on the
// thread count, nor on the other tensors of the list.
template <class T>
void grad_norm_partial(double* out, const TensorSpan<T>* xs, int64_t count, double p);
// x <- x * T(factor) for every tensor (clip_grad_norm's clip, GradScaler's unscale).
template <class T>
void scale_inplace(const TensorSpan<T>* xs, int64_t count, double factor);
// x <- min(max(x, -clip), clip) for every tensor; NaN stays NaN.
template <class T>
void clip_value(const TensorSpan<T>* xs, int64_t count, double clip);

// Instantiated for f32 and f64 by both backends: core/cpu/optim.cpp and cuda/optim.cu end with
// AG_INSTANTIATE_OPTIM_KERNELS.
#define AG_OPTIM_KERNELS(T)                                                                                 \
  AG_INSTANTIATE(sgd_update<T>) AG_INSTANTIATE(adam_update<T>) AG_INSTANTIATE(grad_norm_partial<T>)        \
  AG_INSTANTIATE(scale_inplace<T>) AG_INSTANTIATE(clip_value<T>)
#define AG_INSTANTIATE_OPTIM_KERNELS AG_OPTIM_KERNELS(float) AG_OPTIM_KERNELS(double)

#endif  // AG_KERNELS_CPU
