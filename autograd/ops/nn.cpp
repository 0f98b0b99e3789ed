// Normalisation & losses: softmax, log_softmax, layer_norm, embedding, cross_entropy, dropout.
// Each front checks shapes, dtypes and values, calls its kernel (core/cpu/nn.cpp, declared in
// core/kernels/nn.h) and records the backward. Math: autograd/ops.h.
//
// The kernels take contiguous buffers: a non-contiguous input (a transposed or sliced view) is
// first copied into a dense one; outputs and gradients are always dense.
#include <algorithm>
#include <string_view>

#include "autograd/ops.h"
#include "core/dispatch.h"
#include "core/kernels/dropout_mask.h"

namespace ag {

namespace {

// x's values in a dense buffer, without history: x itself when already contiguous, else a copy.
Tensor dense(const Tensor& x) {
  NoGradGuard no_grad;
  return x.detach().contiguous();
}

// Typed pointer to t's data, or null for an undefined tensor (an absent weight, an unwanted grad).
template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

void check_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  check(a.device() == b.device(), "{}: {} is on {} but {} is on {}", op, a_name, a.device(), b_name, b.device());
}

// The input seen as [outer, C, inner] around dim d (a 0-dim tensor is a single row of one).
struct Split {
  int64_t outer = 1, C = 1, inner = 1;
};
Split split_at(const Shape& s, int d) {
  Split r;
  for (int i = 0; i < s.size(); ++i) (i < d ? r.outer : i == d ? r.C : r.inner) *= s[i];
  return r;
}

// softmax and log_softmax share everything but their kernels.
template <bool Log>
Tensor softmax_family(const char* op, const Tensor& x, int dim) {
  check(is_floating(x.dtype()), "{}: expected an f32 or f64 input, got {} (shape {})", op, x.dtype(), x.shape());
  const int d = wrap_dim(op, dim, std::max(x.ndim(), 1));
  const Split s = split_at(x.shape(), d);
  Tensor xc = dense(x);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  visit_floating(op, x.dtype(), [&]<class T>() {
    if constexpr (Log)
      KERNEL(x.device(), log_softmax_forward<T>, y.data<T>(), xc.data<T>(), s.outer, s.C, s.inner);
    else
      KERNEL(x.device(), softmax_forward<T>, y.data<T>(), xc.data<T>(), s.outer, s.C, s.inner);
  });
  record(op, {x}, y, [op, y = y.detach(), s](const Tensor& g) {  // saves y
    Tensor gc = dense(g), dx = zeros_like(y);
    visit_floating(op, y.dtype(), [&]<class T>() {
      if constexpr (Log)
        KERNEL(y.device(), log_softmax_backward<T>, dx.data<T>(), gc.data<T>(), y.data<T>(), s.outer, s.C, s.inner);
      else
        KERNEL(y.device(), softmax_backward<T>, dx.data<T>(), gc.data<T>(), y.data<T>(), s.outer, s.C, s.inner);
    });
    return std::vector{dx};
  });
  return y;
}

}  // namespace

// A row that is entirely -inf has no maximum to subtract: softmax gives NaN for the whole row and
// log_softmax NaN too, exactly as PyTorch (a fully masked attention row must be avoided upstream).
Tensor softmax(const Tensor& x, int dim, Site site) {
  const CallSite at("softmax", site);
  return softmax_family<false>("softmax", x, dim);
}
Tensor log_softmax(const Tensor& x, int dim, Site site) {
  const CallSite at("log_softmax", site);
  return softmax_family<true>("log_softmax", x, dim);
}

// ---------------------------------------------------------------------------------------------
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps, Site site) {
  const CallSite at("layer_norm", site);
  const int k = normalized_shape.size(), nd = x.ndim();
  check(is_floating(x.dtype()), "layer_norm: expected an f32 or f64 input, got {} (shape {})", x.dtype(), x.shape());
  check(k >= 1 && k <= nd, "layer_norm: normalized_shape {} must be 1 to {} trailing dims of the input shape {}",
        normalized_shape, nd, x.shape());
  for (int i = 0; i < k; ++i)
    check(x.shape()[nd - k + i] == normalized_shape[i],
          "layer_norm: normalized_shape {} does not match the last {} dims of the input shape {}", normalized_shape, k,
          x.shape());
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->defined()) continue;
    check(t->shape() == normalized_shape, "layer_norm: {} has shape {}, expected normalized_shape {}", name, t->shape(),
          normalized_shape);
    check(t->dtype() == x.dtype(), "layer_norm: {} is {} but the input is {}", name, t->dtype(), x.dtype());
    check_device("layer_norm", x, "input", *t, name);
  }
  check(eps >= 0, "layer_norm: eps must be >= 0, got {}", eps);
  const int64_t N = normalized_shape.numel();
  int64_t R = 1;
  for (int i = 0; i < nd - k; ++i) R *= x.shape()[i];

  Tensor xc = dense(x), wc = weight.defined() ? dense(weight) : Tensor(), bc = bias.defined() ? dense(bias) : Tensor();
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  Tensor mean = empty({R}, x.dtype(), x.device()), rstd = empty({R}, x.dtype(), x.device());
  visit_floating("layer_norm", x.dtype(), [&]<class T>() {
    KERNEL(x.device(), layer_norm_forward<T>, y.data<T>(), mean.data<T>(), rstd.data<T>(), xc.data<T>(),
           ptr_or_null<T>(wc), ptr_or_null<T>(bc), R, N, eps);
  });
  const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
             gb = bias.defined() && bias.requires_grad();
  record("layer_norm", {x, weight, bias}, y,
         [xc = xc.detach(), wc, mean, rstd, R, N, gx, gw, gb,
          ns = normalized_shape](const Tensor& g) {  // saves x, mean, rstd
           Tensor gc = dense(g);
           Tensor dx = gx ? empty(xc.shape(), xc.dtype(), xc.device()) : Tensor();  // written (=) by the kernel
           Tensor dw = gw ? zeros(ns, xc.dtype(), xc.device()) : Tensor();
           Tensor db = gb ? zeros(ns, xc.dtype(), xc.device()) : Tensor();
           visit_floating("layer_norm", xc.dtype(), [&]<class T>() {
             KERNEL(xc.device(), layer_norm_backward<T>, ptr_or_null<T>(dx), ptr_or_null<T>(dw), ptr_or_null<T>(db),
                    gc.data<T>(), xc.data<T>(), ptr_or_null<T>(wc), mean.data<T>(), rstd.data<T>(), R, N);
           });
           return std::vector{dx, dw, db};
         });
  return y;
}

// ---------------------------------------------------------------------------------------------
Tensor embedding(const Tensor& weight, const Tensor& indices, Site site) {
  const CallSite at("embedding", site);
  check(weight.ndim() == 2, "embedding: weight must be [V, D], got shape {}", weight.shape());
  check(is_floating(weight.dtype()), "embedding: weight must be f32 or f64, got {}", weight.dtype());
  check(indices.dtype() == DType::i64, "embedding: indices must be i64, got {} (shape {})", indices.dtype(),
        indices.shape());
  check_device("embedding", weight, "weight", indices, "indices");
  const int64_t V = weight.size(0), D = weight.size(1), R = indices.numel();
  Tensor ic = dense(indices);
  {
    Tensor host = host_contiguous(ic);
    const int64_t* idx = host.data<int64_t>();
    for (int64_t r = 0; r < R; ++r)
      check(idx[r] >= 0 && idx[r] < V,
            "embedding: index {} (at flat position {}) is out of range for V = {} rows (weight shape {})", idx[r], r, V,
            weight.shape());
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(D);
  Tensor wc = dense(weight);
  Tensor y = empty(out_shape, weight.dtype(), weight.device());
  visit_floating("embedding", weight.dtype(), [&]<class T>() {
    KERNEL(weight.device(), embedding_forward<T>, y.data<T>(), wc.data<T>(), ic.data<int64_t>(), R, D);
  });
  record("embedding", {weight, indices}, y, [ic, V, D, R, dtype = weight.dtype()](const Tensor& g) {  // saves idx
    Tensor gc = dense(g), dw = zeros({V, D}, dtype, g.device());
    visit_floating("embedding", dtype, [&]<class T>() {
      KERNEL(g.device(), embedding_backward<T>, dw.data<T>(), gc.data<T>(), ic.data<int64_t>(), R, V, D);
    });
    return std::vector{dw, Tensor()};
  });
  return y;
}

// ---------------------------------------------------------------------------------------------
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const char* reduction, int64_t ignore_index,
                     double label_smoothing, Site site) {
  const CallSite at("cross_entropy", site);
  const std::string_view red = reduction ? reduction : "(null)";
  check(red == "mean" || red == "sum" || red == "none",
        "cross_entropy: reduction must be \"mean\", \"sum\" or \"none\", got \"{}\"", red);
  check(is_floating(logits.dtype()), "cross_entropy: logits must be f32 or f64, got {} (shape {})", logits.dtype(),
        logits.shape());
  check(logits.ndim() == 2, "cross_entropy: logits must be [N, C], got shape {}", logits.shape());
  const int64_t N = logits.size(0), C = logits.size(1);
  check(target.dtype() == DType::i64, "cross_entropy: target must be i64 class indices, got {} (shape {})",
        target.dtype(), target.shape());
  check(target.ndim() == 1 && target.size(0) == N,
        "cross_entropy: target must have shape [N] = [{}] for logits of shape {}, got shape {}", N, logits.shape(),
        target.shape());
  check(label_smoothing >= 0 && label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got {}",
        label_smoothing);
  check_device("cross_entropy", logits, "logits", target, "target");
  Tensor tc = dense(target);
  int64_t count = 0;  // rows that are not ignored: the divisor of "mean"
  {
    Tensor host = host_contiguous(tc);
    const int64_t* t = host.data<int64_t>();
    for (int64_t n = 0; n < N; ++n) {
      if (t[n] == ignore_index) continue;
      check(t[n] >= 0 && t[n] < C,
            "cross_entropy: target {} (row {}) is out of range for C = {} classes (logits shape {}, ignore_index {})",
            t[n], n, C, logits.shape(), ignore_index);
      ++count;
    }
  }
  Tensor xc = dense(logits);
  Tensor losses = empty({N}, logits.dtype(), logits.device()), logp = empty({N, C}, logits.dtype(), logits.device());
  visit_floating("cross_entropy", logits.dtype(), [&]<class T>() {
    KERNEL(logits.device(), cross_entropy_forward<T>, losses.data<T>(), logp.data<T>(), xc.data<T>(),
           tc.data<int64_t>(), N, C, ignore_index, label_smoothing);
  });
  Tensor out = losses;
  if (red != "none") {
    NoGradGuard no_grad;
    out = sum(losses);
    // mean over the rows that count; with none left this is 0/0 = NaN, as in PyTorch
    if (red == "mean") out = div(out, double(count));
  }
  const bool per_row = red == "none";
  const double scale = red == "mean" ? 1.0 / double(count) : 1.0;
  record("cross_entropy", {logits, target}, out,
         [logp, tc, N, C, ignore_index, label_smoothing, per_row, scale](const Tensor& g) {  // saves logp
           Tensor gc = dense(g), dlogits = zeros_like(logp);
           visit_floating("cross_entropy", logp.dtype(), [&]<class T>() {
             KERNEL(logp.device(), cross_entropy_backward<T>, dlogits.data<T>(), gc.data<T>(), per_row ? 1 : 0,
                    logp.data<T>(), tc.data<int64_t>(), N, C, ignore_index, label_smoothing, scale);
           });
           return std::vector{dlogits, Tensor()};
         });
  return out;
}

// ---------------------------------------------------------------------------------------------
Tensor dropout(const Tensor& x, double p, bool train, Generator* gen, Site site) {
  const CallSite at("dropout", site);
  check(p >= 0 && p < 1, "dropout: p must be in [0, 1), got {}", p);
  check(is_floating(x.dtype()), "dropout: expected an f32 or f64 input, got {} (shape {})", x.dtype(), x.shape());
  if (!train || p == 0) return x;
  Generator& rng = gen ? *gen : default_generator();
  const int64_t n = x.numel();
  // the mask's Philox blocks, 4 elements each (core/kernels/dropout_mask.h: the rule of the kernels)
  const uint64_t seed = rng.seed(), offset = rng.advance(dropout_blocks(n));
  Tensor xc = dense(x);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  visit_floating("dropout", x.dtype(), [&]<class T>() {
    KERNEL(x.device(), dropout_forward<T>, y.data<T>(), xc.data<T>(), n, p, seed, offset);
  });
  record("dropout", {x}, y, [p, seed, offset, n](const Tensor& g) {  // saves only (seed, offset)
    Tensor gc = dense(g), dx = zeros_like(gc);
    visit_floating("dropout", g.dtype(), [&]<class T>() {
      KERNEL(g.device(), dropout_backward<T>, dx.data<T>(), gc.data<T>(), n, p, seed, offset);
    });
    return std::vector{dx};
  });
  return y;
}

}  // namespace ag
