// matmul: checks, the BLAS description of each operand, dispatch and the tape record.
// Math in autograd/ops.h; kernels in core/cpu/matmul.cpp.
#include <algorithm>
#include <climits>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "core/dispatch.h"

namespace ag {

namespace {

// How BLAS can read the last two dims of x, an (R, C) matrix, without a copy: rows strided by ld
// and columns dense (trans = false), or the reverse (trans = true: x holds a row-major (C, R)
// matrix). The stride of a size-1 dim is never used, so it may be anything.
bool blas_layout(const Tensor& x, bool& trans, int64_t& ld) {
  const int n = x.ndim();
  const int64_t R = x.shape()[n - 2], C = x.shape()[n - 1];
  const int64_t sr = x.strides()[n - 2], sc = x.strides()[n - 1];
  if ((C == 1 || sc == 1) && (R == 1 || sr >= std::max<int64_t>(C, 1))) {
    trans = false;
    ld = R == 1 ? std::max<int64_t>(C, 1) : sr;
    return true;
  }
  if ((R == 1 || sr == 1) && (C == 1 || sc >= std::max<int64_t>(R, 1))) {
    trans = true;
    ld = C == 1 ? std::max<int64_t>(R, 1) : sc;
    return true;
  }
  return false;
}

// x itself when BLAS can read its matrices, else a dense copy (no history: the saved operand).
Tensor blas_operand(const Tensor& x, bool& trans, int64_t& ld) {
  if (blas_layout(x, trans, ld)) return x.detach();
  Tensor c = x.detach().contiguous();
  blas_layout(c, trans, ld);
  return c;
}

// The leading dim when x (..., M, K) can be seen as one (prod(...) * M, K) row-major matrix with
// dense columns, i.e. all dims but the last merge into one strided dim; -1 otherwise.
int64_t folded_ld(const Tensor& x) {
  const int n = x.ndim();
  const int64_t K = x.shape()[n - 1];
  if (K != 1 && x.strides()[n - 1] != 1) return -1;
  int64_t ld = -1, expect = -1;  // the merged dim's stride, and the stride the next outer dim needs
  for (int d = n - 2; d >= 0; --d) {
    if (x.shape()[d] == 1) continue;
    if (ld < 0) ld = x.strides()[d];
    else if (x.strides()[d] != expect) return -1;
    expect = x.strides()[d] * x.shape()[d];
  }
  if (ld < 0) return std::max<int64_t>(K, 1);  // a single row
  return ld >= std::max<int64_t>(K, 1) ? ld : -1;
}

// The Layout of x's batch dims (all but the last two) broadcast to `batch`: stride 0 where x has
// size 1 or no dim at all.
Layout batch_layout(const Tensor& x, const Shape& batch) {
  Layout l;
  l.ndim = batch.size();
  const int lead = batch.size() - (x.ndim() - 2);
  for (int i = 0; i < l.ndim; ++i) {
    int j = i - lead;
    l.shape[i] = batch[i];
    l.strides[i] = (j < 0 || x.shape()[j] == 1) ? 0 : x.strides()[j];
  }
  return l;
}

Shape concat(const Shape& a, std::initializer_list<int64_t> tail) {
  Shape s = a;
  for (int64_t d : tail) s.push_back(d);
  return s;
}

void check_blas_size(const Tensor& a, const Tensor& b, std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes)
    check(s <= INT_MAX, "matmul: {} @ {}: size {} exceeds the 32-bit int range of BLAS", a.shape(), b.shape(), s);
}

// matmul of a (..., M, K) and b (..., K, N), both with >= 2 dims.
Tensor matmul_nd(const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape batch_a, batch_b;
  for (int i = 0; i < a.ndim() - 2; ++i) batch_a.push_back(a.shape()[i]);
  for (int i = 0; i < b.ndim() - 2; ++i) batch_b.push_back(b.shape()[i]);
  Shape batch;
  const int nb = std::max(batch_a.size(), batch_b.size());
  for (int i = 0; i < nb; ++i) {
    int ia = i - (nb - batch_a.size()), ib = i - (nb - batch_b.size());
    int64_t da = ia < 0 ? 1 : batch_a[ia], db = ib < 0 ? 1 : batch_b[ib];
    check(da == db || da == 1 || db == 1, "matmul: {} @ {}: batch dims {} and {} cannot be broadcast", a.shape(),
          b.shape(), batch_a, batch_b);
    batch.push_back(da == 1 ? db : da);
  }
  const Shape out_shape = concat(batch, {M, N});
  Tensor y = empty(out_shape, a.dtype(), a.device());
  const bool ga = a.requires_grad(), gb = b.requires_grad();

  // b shared by every matrix of a, and a's rows in one strided run: one GEMM with M' = B*M.
  const int64_t lda_folded = a.ndim() >= 3 && batch_b.numel() == 1 ? folded_ld(a) : -1;
  if (lda_folded > 0) {
    const int64_t rows = batch_a.numel() * M;
    bool tb;
    int64_t ldb;
    Tensor bs = blas_operand(b, tb, ldb), as = a.detach();
    check_blas_size(a, b, {rows, N, K, lda_folded, ldb});
    cpu::Gemm gemm{rows, N, K, false, tb, lda_folded, ldb, nullptr, nullptr, autocast_operands(a.dtype())};
    visit_floating("matmul", a.dtype(), [&]<class T>() {
      KERNEL(a.device(), matmul_forward, y.data<T>(), as.data<T>(), bs.data<T>(), gemm);
    });
    record("matmul", {a, b}, y, [as, bs, gemm, ga, gb](const Tensor& g) {
      Tensor dout = g.contiguous();
      Tensor da = ga ? empty(as.shape(), as.dtype(), as.device()) : Tensor();
      Tensor db = gb ? empty(bs.shape(), bs.dtype(), bs.device()) : Tensor();
      visit_floating("matmul", g.dtype(), [&]<class T>() {
        KERNEL(g.device(), matmul_backward, ga ? da.data<T>() : nullptr, gb ? db.data<T>() : nullptr,
               dout.data<T>(), as.data<T>(), bs.data<T>(), gemm);
      });
      return std::vector{da, db};
    });
    return y;
  }

  // General case: one GEMM per matrix of the broadcast batch.
  bool ta, tb;
  int64_t lda, ldb;
  Tensor as = blas_operand(a, ta, lda), bs = blas_operand(b, tb, ldb);
  check_blas_size(a, b, {M, N, K, lda, ldb});
  const Layout la = batch_layout(as, batch), lb = batch_layout(bs, batch);
  cpu::Gemm gemm{M, N, K, ta, tb, lda, ldb, &la, &lb, autocast_operands(a.dtype())};
  visit_floating("matmul", a.dtype(), [&]<class T>() {
    KERNEL(a.device(), matmul_forward, y.data<T>(), as.data<T>(), bs.data<T>(), gemm);
  });
  record("matmul", {a, b}, y, [as, bs, la, lb, gemm, batch, ga, gb](const Tensor& g) {
    cpu::Gemm geo = gemm;
    geo.batch_a = &la;
    geo.batch_b = &lb;
    Tensor dout = g.contiguous();
    // gradients over the full batch, then summed over the dims where an input was broadcast
    Tensor da = ga ? empty(concat(batch, {geo.M, geo.K}), g.dtype(), g.device()) : Tensor();
    Tensor db = gb ? empty(concat(batch, {geo.K, geo.N}), g.dtype(), g.device()) : Tensor();
    visit_floating("matmul", g.dtype(), [&]<class T>() {
      KERNEL(g.device(), matmul_backward, ga ? da.data<T>() : nullptr, gb ? db.data<T>() : nullptr,
             dout.data<T>(), as.data<T>(), bs.data<T>(), geo);
    });
    return std::vector{ga ? sum_to(da, as.shape()) : Tensor(), gb ? sum_to(db, bs.shape()) : Tensor()};
  });
  return y;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, Site site) {
  const CallSite at("linear", site);
  check(x.defined() && w.defined(), "linear: the input and the weight must be defined tensors");
  check(w.ndim() == 2, "linear: weight must be [out, in], got {}", w.shape());
  check(x.ndim() >= 1 && x.size(-1) == w.size(1), "linear: input {} and weight {}: the input's last dim must be in = {}",
        x.shape(), w.shape(), w.size(1));
  check(!b.defined() || (b.ndim() == 1 && b.size(0) == w.size(0)), "linear: bias {} must be [out] = [{}]",
        b.defined() ? b.shape() : Shape{}, w.size(0));
  check(x.device() == w.device() && (!b.defined() || b.device() == x.device()),
        "linear: input, weight and bias on different devices ({}, {}{})", x.device(), w.device(),
        b.defined() ? fmt::format(", {}", b.device()) : std::string());
  check(x.dtype() == w.dtype() && (!b.defined() || b.dtype() == x.dtype()),
        "linear: input {} and weight {}{} dtypes differ; convert with .to(dtype)", x.dtype(), w.dtype(),
        b.defined() ? fmt::format(" and bias {}", b.dtype()) : std::string());
  check(is_floating(x.dtype()), "linear: expected f32 or f64 inputs, got {}", x.dtype());
  const int64_t in = w.size(1), out = w.size(0);
  int64_t rows = 1;  // the product of x's leading dims (not numel / in: in may be 0)
  for (int d = 0; d + 1 < x.ndim(); ++d) rows *= x.shape()[d];
  // x as one (rows, in) matrix read in place when its leading dims merge; w (out, in) read as W^T
  Tensor xs = x.ndim() >= 2 ? x.detach() : x.detach().unsqueeze(0);
  int64_t ldx = folded_ld(xs);
  if (ldx <= 0) xs = xs.contiguous(), ldx = std::max<int64_t>(in, 1);
  // inference under bf16 autocast on the CPU: the weight's bf16 copy, rounded once and kept (then
  // the f32 weight is not read, so it is not made contiguous either)
  const Tensor wk = x.device().is_cpu() ? autocast_bf16_weight(w) : Tensor();
  Tensor ws = w.detach();
  if (!wk.defined() && (!(w.strides()[1] == 1 || in == 1) || w.strides()[0] < in)) ws = ws.contiguous();
  const int64_t ldw = out == 1 ? std::max<int64_t>(in, 1) : std::max<int64_t>(ws.strides()[0], in);
  Tensor bs = b.defined() ? b.detach().contiguous() : Tensor();
  check_blas_size(x, w, {rows, out, in, ldx, ldw});
  Shape out_shape;
  for (int d = 0; d + 1 < x.ndim(); ++d) out_shape.push_back(x.shape()[d]);
  out_shape.push_back(out);
  Tensor y = empty(out_shape, x.dtype(), x.device());
  const Precision operands = autocast_operands(x.dtype());  // read now, kept for backward
  const bool gx = x.requires_grad(), gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
  // Under bf16 or fp16 autocast dW's product reads x rounded to that format anyway: keep x for
  // backward as that rounded copy, in 16 bits (half the activation memory of every Linear), and
  // widen it back (exactly) when dW is computed. The same numbers as keeping x itself. Under bf16
  // on the CPU the forward product reads that copy too (matmul_forward_a16: x rounded once, not
  // again while it is packed; the same bits).
  Tensor saved = gw ? xs : Tensor();
  int64_t ld_saved = ldx;
  if (gw && operands != Precision::fp32 && grad_enabled()) {  // (nothing is kept without recording)
    saved = cast(xs, stored_dtype(operands));
    ld_saved = std::max<int64_t>(in, 1);
  }
  if (saved.defined() && saved.dtype() == DType::bf16 && x.device().is_cpu() && x.dtype() == DType::f32 &&
      !wk.defined()) {
    const cpu::Gemm gemm{rows, out, in, false, true, ld_saved, ldw, nullptr, nullptr, operands};
    const detail::KernelScope scope("matmul_forward_a16", x.device(), typeid(gemm));
    cpu::matmul_forward_a16(y.data<float>(), saved.data<bf16>(), ws.data<float>(), gemm,
                            bs.defined() ? bs.data<float>() : nullptr);
  } else if (wk.defined()) {
    const cpu::Gemm gemm{rows, out, in, false, true, ldx, std::max<int64_t>(in, 1), nullptr, nullptr, operands};
    const detail::KernelScope scope("matmul_forward_b16", x.device(), typeid(gemm));
    cpu::matmul_forward_b16(y.data<float>(), xs.data<float>(), wk.data<bf16>(), gemm,
                            bs.defined() ? bs.data<float>() : nullptr);
  } else {
    const cpu::Gemm gemm{rows, out, in, false, true, ldx, ldw, nullptr, nullptr, operands};
    visit_floating("linear", x.dtype(), [&]<class T>() {
      KERNEL(x.device(), matmul_forward, y.data<T>(), xs.data<T>(), ws.data<T>(), gemm,
             bs.defined() ? bs.data<T>() : static_cast<const T*>(nullptr));
    });
  }
  const Shape x_shape = x.shape();
  auto backward = [saved, ws, x_shape, rows, in, out, ld_saved, ldw, operands, gx, gw, gb](const Tensor& g) {
    // in the forward pass this was  y[r, o] = sum_i x[r, i] w[o, i] + b[o]  for every row r, so now
    //   dx[r, i] = sum_o g[r, o] w[o, i]     dx = g W        (rows, out) @ (out, in)
    //   dw[o, i] = sum_r g[r, o] x[r, i]     dw = g^T X      (out, rows) @ (rows, in): W's own layout
    //   db[o]    = sum_r g[r, o]
    Tensor dout = g.contiguous();
    Tensor dx = gx ? empty(x_shape, g.dtype(), g.device()) : Tensor();
    Tensor dw = gw ? empty({out, in}, g.dtype(), g.device()) : Tensor();
    // a bf16 x on the CPU is read as it is (matmul_forward_b16: no widened copy); else widened
    const bool read_b16 = gw && saved.dtype() == DType::bf16 && g.device().is_cpu() && g.dtype() == DType::f32;
    const Tensor xs = gw && is_half(saved.dtype()) && !read_b16 ? cast(saved, g.dtype()) : saved;
    const cpu::Gemm gemm_dw{out, in, rows, true, false, std::max<int64_t>(out, 1), ld_saved, nullptr, nullptr, operands};
    visit_floating("linear", g.dtype(), [&]<class T>() {
      if (gx)
        KERNEL(g.device(), matmul_forward, dx.data<T>(), dout.data<T>(), ws.data<T>(),
               cpu::Gemm{rows, in, out, false, false, std::max<int64_t>(out, 1), ldw, nullptr, nullptr, operands},
               static_cast<const T*>(nullptr));
      if (gw && !read_b16)
        KERNEL(g.device(), matmul_forward, dw.data<T>(), dout.data<T>(), xs.data<T>(), gemm_dw,
               static_cast<const T*>(nullptr));
    });
    if (read_b16) {
      const detail::KernelScope scope("matmul_forward_b16", g.device(), typeid(gemm_dw));
      cpu::matmul_forward_b16(dw.data<float>(), dout.data<float>(), xs.data<bf16>(), gemm_dw);
    }
    Tensor db = gb ? sum(dout.reshape({rows, out}), {0}) : Tensor();
    return std::vector{dx, dw, db};
  };
  if (b.defined())
    record("linear", {x, w, b}, y, backward);
  else
    record("linear", {x, w}, y, [backward](const Tensor& g) {
      auto grads = backward(g);
      grads.pop_back();
      return grads;
    });
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b, Site site) {
  const CallSite at("matmul", site);
  check(a.ndim() >= 1 && b.ndim() >= 1, "matmul: {} @ {}: both inputs need at least 1 dim (got a 0-dim tensor)",
        a.shape(), b.shape());
  check(a.device() == b.device(), "matmul: {} @ {}: inputs on different devices ({} and {})", a.shape(), b.shape(),
        a.device(), b.device());
  check(a.dtype() == b.dtype(), "matmul: {} @ {}: dtypes {} and {} differ; convert one with .to(dtype)", a.shape(),
        b.shape(), a.dtype(), b.dtype());
  check(is_floating(a.dtype()), "matmul: {} @ {}: expected f32 or f64 inputs, got {}", a.shape(), b.shape(),
        a.dtype());
  const int64_t ka = a.size(-1), kb = b.ndim() == 1 ? b.size(0) : b.size(-2);
  check(ka == kb, "matmul: {} @ {}: inner dimensions {} and {} differ", a.shape(), b.shape(), ka, kb);
  if (a.ndim() >= 2 && b.ndim() >= 2) return matmul_nd(a, b);
  // 1-D operands as in torch.matmul: a is a row (1, K), b a column (K, 1); the added dim is
  // removed from the result (both 1-D: a dot product, 0-dim).
  Tensor y = matmul_nd(a.ndim() == 1 ? a.unsqueeze(0) : a, b.ndim() == 1 ? b.unsqueeze(-1) : b);
  if (b.ndim() == 1) y = y.squeeze(-1);
  if (a.ndim() == 1) y = y.squeeze(b.ndim() == 1 ? -1 : -2);
  return y;
}

}  // namespace ag
