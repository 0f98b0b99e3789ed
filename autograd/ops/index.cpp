// index_select: checks (including every index value), dispatch and the tape record.
// Math in autograd/ops.h; kernels in core/cpu/index.cpp.
#include "autograd/ops.h"
#include "core/dispatch.h"

namespace ag {

Tensor index_select(const Tensor& x, int dim, const Tensor& index, Site site) {
  const CallSite at("index_select", site);
  check(x.ndim() >= 1, "index_select: cannot index a 0-dim tensor");
  check(index.dtype() == DType::i64, "index_select: index must have dtype i64, got {}", index.dtype());
  check(index.ndim() == 1, "index_select: index must be 1-D, got shape {}", index.shape());
  check(index.device() == x.device(), "index_select: input is on {} but index is on {}", x.device(),
        index.device());
  const int d = wrap_dim("index_select", dim, x.ndim());
  const int64_t N = x.shape()[d], L = index.numel();
  const Tensor idx = index.contiguous();
  {
    const Tensor host = host_contiguous(idx);
    const int64_t* p = host.data<int64_t>();
    for (int64_t l = 0; l < L; ++l)
      check(p[l] >= 0 && p[l] < N, "index_select: index {} (at position {}) is out of range for dim {} of size {} (input shape {})",
            p[l], l, dim, N, x.shape());
  }
  // x seen as contiguous (B, N, D) around dim d
  int64_t B = 1, D = 1;
  for (int i = 0; i < d; ++i) B *= x.shape()[i];
  for (int i = d + 1; i < x.ndim(); ++i) D *= x.shape()[i];
  const Tensor xc = x.detach().contiguous();
  Shape out_shape = x.shape();
  out_shape[d] = L;
  Tensor y = empty(out_shape, x.dtype(), x.device());
  visit_numeric("index_select", x.dtype(), [&]<class T>() {
    KERNEL(x.device(), index_select_forward, y.data<T>(), xc.data<T>(), idx.data<int64_t>(), B, N, L, D);
  });
  record("index_select", {x}, y, [idx, in = x.shape(), B, N, L, D](const Tensor& g) {
    const Tensor dout = g.contiguous();
    Tensor dx = zeros(in, g.dtype(), g.device());
    visit_floating("index_select", g.dtype(), [&]<class T>() {
      KERNEL(g.device(), index_select_backward, dx.data<T>(), dout.data<T>(), idx.data<int64_t>(), B, N, L, D);
    });
    return std::vector{dx};
  });
  return y;
}

}  // namespace ag
