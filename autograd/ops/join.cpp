// Joining and splitting: cat, stack, split, chunk. Math in autograd/ops.h.
// cat copies each input into its slice of the output (the strided_copy kernel of the tensor
// core); split and chunk are narrow() views, so their backward is narrow's.
#include "autograd/ops.h"
#include "core/dispatch.h"

namespace ag {

namespace {

// Dtype, device and shape agreement of xs with xs[0], every dim equal except `dim` (-1: none).
void check_joinable(const char* op, const std::vector<Tensor>& xs, int dim) {
  const Tensor& x0 = xs[0];
  for (size_t k = 1; k < xs.size(); ++k) {
    const Tensor& x = xs[k];
    check(x.dtype() == x0.dtype(), "{}: input {} has dtype {} but input 0 has {}", op, k, x.dtype(), x0.dtype());
    check(x.device() == x0.device(), "{}: input {} is on {} but input 0 is on {}", op, k, x.device(), x0.device());
    bool same = x.ndim() == x0.ndim();
    for (int i = 0; same && i < x.ndim(); ++i) same = i == dim || x.shape()[i] == x0.shape()[i];
    if (dim >= 0)
      check(same, "{}: input {} has shape {} but input 0 has shape {}; they must match except in dim {}", op, k,
            x.shape(), x0.shape(), dim);
    else
      check(same, "{}: input {} has shape {} but input 0 has shape {}; they must match", op, k, x.shape(),
            x0.shape());
  }
}

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int dim, Site site) {
  const CallSite at("cat", site);
  check(!xs.empty(), "cat: expected a non-empty list of tensors");
  for (size_t k = 0; k < xs.size(); ++k)
    check(xs[k].ndim() > 0, "cat: input {} is 0-dim; only tensors with >= 1 dim can be concatenated", k);
  const int d = wrap_dim("cat", dim, xs[0].ndim());
  check_joinable("cat", xs, d);

  Shape out_shape = xs[0].shape();
  out_shape[d] = 0;
  for (const Tensor& x : xs) out_shape[d] += x.shape()[d];
  Tensor y = empty(out_shape, xs[0].dtype(), xs[0].device());
  // input k goes to y[..., offset_k : offset_k + size_k, ...], a strided slice of y's storage
  std::vector<int64_t> offsets, sizes;
  int64_t off = 0;
  for (const Tensor& x : xs) {
    offsets.push_back(off);
    sizes.push_back(x.shape()[d]);
    Layout dst = layout(y);
    dst.shape[d] = x.shape()[d];
    if (x.numel() > 0) {
      visit_storage(y.dtype(), [&]<class T>() {
        KERNEL(y.device(), strided_copy, y.data<T>() + off * y.strides()[d], dst, x.data<T>(), layout(x));
      });
    }
    off += x.shape()[d];
  }
  record("cat", xs, y, [d, offsets, sizes](const Tensor& g) {
    std::vector<Tensor> dxs;
    for (size_t k = 0; k < sizes.size(); ++k) dxs.push_back(g.narrow(d, offsets[k], sizes[k]));
    return dxs;
  });
  return y;
}

Tensor stack(const std::vector<Tensor>& xs, int dim, Site site) {
  const CallSite at("stack", site);
  check(!xs.empty(), "stack: expected a non-empty list of tensors");
  check_joinable("stack", xs, -1);
  const int d = wrap_dim("stack", dim, xs[0].ndim() + 1);
  std::vector<Tensor> us;
  for (const Tensor& x : xs) us.push_back(x.unsqueeze(d));
  return cat(us, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int dim, Site site) {
  const CallSite at("split", site);
  check(x.ndim() > 0, "split: cannot split a 0-dim tensor");
  const int d = wrap_dim("split", dim, x.ndim());
  const int64_t n = x.shape()[d];
  check(split_size > 0 || (split_size == 0 && n == 0),
        "split: split_size must be >= 1 (0 only for an empty dim), got {} for dim {} of size {}", split_size, dim, n);
  if (n == 0) return {x.narrow(d, 0, 0)};
  std::vector<Tensor> parts;
  for (int64_t s = 0; s < n; s += split_size) parts.push_back(x.narrow(d, s, std::min(split_size, n - s)));
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim, Site site) {
  const CallSite at("chunk", site);
  check(chunks >= 1, "chunk: chunks must be >= 1, got {}", chunks);
  check(x.ndim() > 0, "chunk: cannot chunk a 0-dim tensor");
  const int d = wrap_dim("chunk", dim, x.ndim());
  const int64_t n = x.shape()[d];
  // as torch.chunk: pieces of ceil(n / chunks), so there may be fewer than `chunks` of them; an
  // empty dim gives `chunks` empty pieces
  if (n == 0) {
    std::vector<Tensor> parts;
    for (int64_t k = 0; k < chunks; ++k) parts.push_back(x.narrow(d, 0, 0));
    return parts;
  }
  return split(x, (n + chunks - 1) / chunks, d);
}

}  // namespace ag
