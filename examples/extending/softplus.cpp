// softplus: the front (math: softplus.h). Checks the arguments, runs the kernel of the tensor's
// device, and records the op on attograd's tape with its backward.
#include "softplus.h"

#include <cmath>

#include "softplus_kernels.h"

namespace ext {

using ag::check;
using ag::Device;
using ag::DType;
using ag::Tensor;

void raise_cuda_error(const char* kernel, const char* what) { ag::fail("[{}] CUDA error: {}", kernel, what); }

namespace {

// snippet-begin: dispatch
// The device switch: cpu:: for a CPU tensor, cuda:: for a GPU one when attograd was built with
// CUDA. (Inside attograd the KERNEL macro of core/dispatch.h is this switch.)
template <class T>
void softplus_forward_on(Device device, T* out, const T* inp, int64_t N, double beta, double threshold) {
  if (device.is_cuda()) {
#if ATTOGRAD_WITH_CUDA
    cuda::softplus_forward(device.index, out, inp, N, beta, threshold);
#else
    ag::fail("[softplus] this build of attograd has no CUDA backend (tensor on {})", device);
#endif
  } else {
    cpu::softplus_forward(out, inp, N, beta, threshold);
  }
}

template <class T>
void softplus_backward_on(Device device, T* dinp, const T* dout, const T* inp, int64_t N, double beta,
                          double threshold) {
  if (device.is_cuda()) {
#if ATTOGRAD_WITH_CUDA
    cuda::softplus_backward(device.index, dinp, dout, inp, N, beta, threshold);
#else
    ag::fail("[softplus] this build of attograd has no CUDA backend (tensor on {})", device);
#endif
  } else {
    cpu::softplus_backward(dinp, dout, inp, N, beta, threshold);
  }
}
// snippet-end: dispatch

}  // namespace

// snippet-begin: front
Tensor softplus(const Tensor& x_, double beta, double threshold) {
  // 1. checks, before any work, with messages that name the op and the offending values
  check(x_.defined(), "[softplus] expected a tensor, got an undefined one");
  check(ag::is_floating(x_.dtype()), "[softplus] expected a floating tensor (f32 or f64), got {} of shape {}",
        x_.dtype(), x_.shape());
  check(beta > 0 && std::isfinite(beta), "[softplus] expected a finite beta > 0, got beta = {}", beta);
  check(!std::isnan(threshold), "[softplus] expected a threshold that is a number, got {}", threshold);

  // 2. the kernel: it reads a flat array, so a strided view is copied first (contiguous() is
  //    itself recorded, so the gradient still reaches the caller's x)
  const Tensor x = x_.contiguous();
  const int64_t N = x.numel();
  Tensor y = ag::empty(x.shape(), x.dtype(), x.device());
  if (x.dtype() == DType::f32)
    softplus_forward_on(x.device(), y.data<float>(), x.data<float>(), N, beta, threshold);
  else
    softplus_forward_on(x.device(), y.data<double>(), x.data<double>(), N, beta, threshold);

  // 3. the tape: the backward saves x (detached: what the node keeps is data, not history) and
  //    maps the output's gradient g to x's; the tape checks its shape and sums it into x's.
  ag::record("softplus", {x}, y, [x = x.detach(), beta, threshold](const Tensor& g_) {
    const Tensor g = g_.contiguous();
    Tensor dx = ag::empty(x.shape(), x.dtype(), x.device());
    const int64_t N = x.numel();
    if (x.dtype() == DType::f32)
      softplus_backward_on(x.device(), dx.data<float>(), g.data<float>(), x.data<float>(), N, beta, threshold);
    else
      softplus_backward_on(x.device(), dx.data<double>(), g.data<double>(), x.data<double>(), N, beta, threshold);
    return std::vector{dx};
  });
  return y;
}
// snippet-end: front

}  // namespace ext
