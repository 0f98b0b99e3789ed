#pragma once
// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_. Parameters without a
// gradient are skipped; gradients are changed in place (a non-contiguous one is first replaced by
// a contiguous copy). Each runs one multi-tensor kernel per device and dtype of the gradients
// (core/kernels/optim.h): on a GPU a few launches for the whole model, and clip_grad_norm reads
// its partial sums back once per device, never once per tensor. Derived step by step:
// docs/math/clip.md
#include <vector>

#include "core/tensor.h"

namespace ag::optim {

// The norm of all gradients together, as if concatenated into one vector:
//   norm = (sum_params sum_i |g_i|^p)^(1/p),  or max_i |g_i| for p = +inf,
// computed in double (the same value on any thread count). When
//   clip_coef = max_norm / (norm + 1e-6)
// is below 1, every gradient is scaled by it (so the clipped norm is just under max_norm).
// Returns the norm before clipping (0 when no parameter has a gradient). With error_if_nonfinite,
// a NaN or infinite norm raises ag::Error and leaves the gradients unchanged; without it they are
// scaled by the NaN/0 coefficient, as PyTorch does.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2,
                      bool error_if_nonfinite = false);
// g_i <- clamp(g_i, -clip_value, clip_value) for every gradient.
void clip_grad_value(const std::vector<Tensor>& params, double clip_value);
// g_i <- g_i * factor for every gradient (GradScaler's unscale); factor must be finite.
void scale_grads(const std::vector<Tensor>& params, double factor);

}  // namespace ag::optim
