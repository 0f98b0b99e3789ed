#pragma once
// Optimizer kernels, multi-tensor: one call updates a whole list of tensors of one device and
// dtype (an optimizer groups its parameters so: optim::group_by_device_and_dtype). Each element is
// read and written once; on the GPU the list goes in a few launches (each takes a table of up to a
// few dozen tensors and 320 chunks of 64K elements as its kernel parameter), not one per tensor: a
// toy model's step has ~50 small tensors and would otherwise be bound by launch latency. On the
// CPU the list is one parallel loop over all its elements, not one OpenMP region per tensor.
// The update rules are written in math above each optimizer (optim/sgd.h, optim/adam.h) and again
// above each kernel (core/cpu/optim.cpp). Every pointer is a contiguous buffer of n elements, the
// shape of its parameter; scalars are the optimizer's hyper-parameters (double, cast to T as
// PyTorch casts a Python float for the tensor).
#include <cstdint>

namespace ag {

// One parameter of SGD; `first` says its momentum buffer is fresh (b <- g); buf is unused (may be
// null) when momentum == 0.
template <class T>
struct SgdTensor {
  T* param;
  T* buf;
  const T* grad;
  int64_t n;
  bool first;
};
// One parameter of Adam / AdamW, `step` counting this update (1 at its first).
template <class T>
struct AdamTensor {
  T* param;
  T* exp_avg;
  T* exp_avg_sq;
  const T* grad;
  int64_t n;
  int64_t step;
};
// One contiguous buffer (a gradient) of the norm, scale and clamp kernels.
template <class T>
struct TensorSpan {
  T* data;
  int64_t n;
};

}  // namespace ag

namespace ag::cpu {

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

}  // namespace ag::cpu

// The same on the GPU (cuda/optim.cu): the lists are host arrays of device pointers. out of
// grad_norm_partial is in device memory (no host round trip: the caller reads it back once).
namespace ag::cuda {

template <class T>
void sgd_update(const SgdTensor<T>* ts, int64_t count, double lr, double momentum, double dampening,
                double weight_decay, bool nesterov);
template <class T>
void adam_update(const AdamTensor<T>* ts, int64_t count, double lr, double beta1, double beta2, double eps,
                 double weight_decay, bool decoupled);
template <class T>
void grad_norm_partial(double* out, const TensorSpan<T>* xs, int64_t count, double p);
template <class T>
void scale_inplace(const TensorSpan<T>* xs, int64_t count, double factor);
template <class T>
void clip_value(const TensorSpan<T>* xs, int64_t count, double clip);

}  // namespace ag::cuda

// The explicit instantiations of the kernels above for one T, in the namespace of the file that
// defines them (core/cpu/optim.cpp, cuda/optim.cu).
#define AG_OPTIM_KERNELS(T)                                                                            \
  template void sgd_update<T>(const SgdTensor<T>*, int64_t, double, double, double, double, bool);           \
  template void adam_update<T>(const AdamTensor<T>*, int64_t, double, double, double, double, double, bool); \
  template void grad_norm_partial<T>(double*, const TensorSpan<T>*, int64_t, double);                       \
  template void scale_inplace<T>(const TensorSpan<T>*, int64_t, double);                                     \
  template void clip_value<T>(const TensorSpan<T>*, int64_t, double);
