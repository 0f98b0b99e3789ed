// Elementwise ops: checks, dispatch to the pointwise engine (map1/map2/map3 of core/kernels/core.h)
// with the functors of core/kernels/pointwise.h, and the tape record. Math: autograd/ops.h.
// The engine is compiled once per backend for the (functor, dtype) pairs listed in
// core/kernels/pointwise.h (core/cpu/pointwise.cpp, cuda/pointwise.cu): a new pairing here is a
// new line there.
#include "autograd/ops.h"
#include "core/dispatch.h"
#include "core/kernels.h"

namespace ag {

namespace {

void check_same(const char* op, const Tensor& a, const Tensor& b) {
  check(a.device() == b.device(), "{}: inputs on different devices ({} and {})", op, a.device(), b.device());
  check(a.dtype() == b.dtype(), "{}: inputs have different dtypes ({} and {}); convert one with .to(dtype)", op,
        a.dtype(), b.dtype());
}

// Both inputs expanded to their broadcast shape (recorded, so gradients are summed back).
std::pair<Tensor, Tensor> broadcast(const char* op, const Tensor& a, const Tensor& b) {
  check_same(op, a, b);
  Shape s = broadcast_shapes(op, a.shape(), b.shape());
  return {a.expand(s), b.expand(s)};
}

// y = f(x) for floating x (or any dtype `Visit` admits); y is contiguous, x's shape and dtype.
template <class F>
Tensor map_float1(const char* op, const Tensor& x, F f) {
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  visit_floating(op, x.dtype(), [&]<class T>() { KERNEL(x.device(), map1, y.data<T>(), x.data<T>(), layout(x), f); });
  return y;
}
// y = f(a, b) over same-shape floating inputs.
template <class F>
Tensor map_float2(const char* op, const Tensor& a, const Tensor& b, F f) {
  Tensor y = empty(a.shape(), a.dtype(), a.device());
  visit_floating(op, a.dtype(), [&]<class T>() {
    KERNEL(a.device(), map2, y.data<T>(), a.data<T>(), layout(a), b.data<T>(), layout(b), f);
  });
  return y;
}
// y = f(a, b, c) over same-shape floating inputs.
template <class F>
Tensor map_float3(const char* op, const Tensor& a, const Tensor& b, const Tensor& c, F f) {
  Tensor y = empty(a.shape(), a.dtype(), a.device());
  visit_floating(op, a.dtype(), [&]<class T>() {
    KERNEL(a.device(), map3, y.data<T>(), a.data<T>(), layout(a), b.data<T>(), layout(b), c.data<T>(), layout(c), f);
  });
  return y;
}
// y = f(a, b) for numeric (f32, f64, i64) same-shape inputs.
template <class F>
Tensor map_numeric2(const char* op, const Tensor& a, const Tensor& b, F f) {
  Tensor y = empty(a.shape(), a.dtype(), a.device());
  visit_numeric(op, a.dtype(), [&]<class T>() {
    KERNEL(a.device(), map2, y.data<T>(), a.data<T>(), layout(a), b.data<T>(), layout(b), f);
  });
  return y;
}

Tensor scalar_like(double v, const Tensor& t) { return scalar_tensor(v, t.dtype(), t.device()); }

// Unary op whose backward needs only the output y: dx = Back(y, g).
template <class F, class Back>
Tensor unary_saving_output(const char* op, const Tensor& x, F f, Back back) {
  Tensor y = map_float1(op, x, f);
  record(op, {x}, y, [op, y = y.detach(), back](const Tensor& g) { return std::vector{map_float2(op, y, g, back)}; });
  return y;
}
// Unary op whose backward needs the input x: dx = Back(x, g).
template <class F, class Back>
Tensor unary_saving_input(const char* op, const Tensor& x, F f, Back back) {
  Tensor y = map_float1(op, x, f);
  record(op, {x}, y, [op, x = x.detach(), back](const Tensor& g) { return std::vector{map_float2(op, x, g, back)}; });
  return y;
}

}  // namespace

// ---- arithmetic ----------------------------------------------------------------------------
Tensor add(const Tensor& a_, const Tensor& b_, Site site) {
  const CallSite at("add", site);
  auto [a, b] = broadcast("add", a_, b_);
  Tensor y = map_numeric2("add", a, b, pw::Add{});
  record("add", {a, b}, y, [](const Tensor& g) { return std::vector{g, g}; });
  return y;
}

Tensor sub(const Tensor& a_, const Tensor& b_, Site site) {
  const CallSite at("sub", site);
  auto [a, b] = broadcast("sub", a_, b_);
  Tensor y = map_numeric2("sub", a, b, pw::Sub{});
  record("sub", {a, b}, y, [](const Tensor& g) { return std::vector{g, neg(g)}; });
  return y;
}

Tensor mul(const Tensor& a_, const Tensor& b_, Site site) {
  const CallSite at("mul", site);
  auto [a, b] = broadcast("mul", a_, b_);
  Tensor y = map_numeric2("mul", a, b, pw::Mul{});
  bool ga = a.requires_grad(), gb = b.requires_grad();
  record("mul", {a, b}, y, [a = a.detach(), b = b.detach(), ga, gb](const Tensor& g) {
    return std::vector{ga ? mul(g, b) : Tensor(), gb ? mul(g, a) : Tensor()};
  });
  return y;
}

Tensor div(const Tensor& a_, const Tensor& b_, Site site) {
  const CallSite at("div", site);
  auto [a, b] = broadcast("div", a_, b_);
  Tensor y = map_float2("div", a, b, pw::Div{});
  bool ga = a.requires_grad(), gb = b.requires_grad();
  record("div", {a, b}, y, [a = a.detach(), b = b.detach(), ga, gb](const Tensor& g) {
    return std::vector{ga ? map_float2("div", g, b, pw::Div{}) : Tensor(),
                       gb ? map_float3("div", a, b, g, pw::DivBackwardB{}) : Tensor()};
  });
  return y;
}

Tensor add(const Tensor& a, double b, Site site) {
  const CallSite at("add", site);
  return add(a, scalar_like(b, a));
}
Tensor sub(const Tensor& a, double b, Site site) {
  const CallSite at("sub", site);
  return sub(a, scalar_like(b, a));
}
Tensor sub(double a, const Tensor& b, Site site) {
  const CallSite at("sub", site);
  return sub(scalar_like(a, b), b);
}
Tensor mul(const Tensor& a, double b, Site site) {
  const CallSite at("mul", site);
  return mul(a, scalar_like(b, a));
}
Tensor div(const Tensor& a, double b, Site site) {
  const CallSite at("div", site);
  return div(a, scalar_like(b, a));
}
Tensor div(double a, const Tensor& b, Site site) {
  const CallSite at("div", site);
  return div(scalar_like(a, b), b);
}

Tensor neg(const Tensor& x, Site site) {
  const CallSite at("neg", site);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  visit_numeric("neg", x.dtype(), [&]<class T>() {
    KERNEL(x.device(), map1, y.data<T>(), x.data<T>(), layout(x), pw::Neg{});
  });
  record("neg", {x}, y, [](const Tensor& g) { return std::vector{neg(g)}; });
  return y;
}

Tensor pow(const Tensor& x, double p, Site site) {
  const CallSite at("pow", site);
  Tensor y = map_float1("pow", x, pw::PowScalar{p});
  record("pow", {x}, y, [x = x.detach(), p](const Tensor& g) {
    return std::vector{map_float2("pow", x, g, pw::PowScalarBackward{p})};
  });
  return y;
}

Tensor pow(const Tensor& x_, const Tensor& t_, Site site) {
  const CallSite at("pow", site);
  auto [x, t] = broadcast("pow", x_, t_);
  Tensor y = map_float2("pow", x, t, pw::Pow{});
  bool gx = x.requires_grad(), gt = t.requires_grad();
  record("pow", {x, t}, y, [x = x.detach(), t = t.detach(), gx, gt](const Tensor& g) {
    return std::vector{gx ? map_float3("pow", x, t, g, pw::PowBackwardX{}) : Tensor(),
                       gt ? map_float3("pow", x, t, g, pw::PowBackwardT{}) : Tensor()};
  });
  return y;
}

// ---- unary -------------------------------------------------------------------------------
Tensor exp(const Tensor& x, Site site) {
  const CallSite at("exp", site);
  return unary_saving_output("exp", x, pw::Exp{}, pw::ExpBackward{});
}
Tensor log(const Tensor& x, Site site) {
  const CallSite at("log", site);
  return unary_saving_input("log", x, pw::Log{}, pw::LogBackward{});
}
Tensor sqrt(const Tensor& x, Site site) {
  const CallSite at("sqrt", site);
  return unary_saving_output("sqrt", x, pw::Sqrt{}, pw::SqrtBackward{});
}
Tensor rsqrt(const Tensor& x, Site site) {
  const CallSite at("rsqrt", site);
  return unary_saving_output("rsqrt", x, pw::Rsqrt{}, pw::RsqrtBackward{});
}
Tensor tanh(const Tensor& x, Site site) {
  const CallSite at("tanh", site);
  return unary_saving_output("tanh", x, pw::Tanh{}, pw::TanhBackward{});
}
Tensor sigmoid(const Tensor& x, Site site) {
  const CallSite at("sigmoid", site);
  return unary_saving_output("sigmoid", x, pw::Sigmoid{}, pw::SigmoidBackward{});
}
Tensor relu(const Tensor& x, Site site) {
  const CallSite at("relu", site);
  return unary_saving_input("relu", x, pw::Relu{}, pw::ReluBackward{});
}
Tensor abs(const Tensor& x, Site site) {
  const CallSite at("abs", site);
  return unary_saving_input("abs", x, pw::Abs{}, pw::AbsBackward{});
}
Tensor silu(const Tensor& x, Site site) {
  const CallSite at("silu", site);
  return unary_saving_input("silu", x, pw::Silu{}, pw::SiluBackward{});
}

Tensor gelu(const Tensor& x, const char* approximate, Site site) {
  const CallSite at("gelu", site);
  std::string_view a = approximate ? approximate : "(null)";
  check(a == "none" || a == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"{}\"", a);
  if (a == "tanh") return unary_saving_input("gelu", x, pw::GeluTanh{}, pw::GeluTanhBackward{});
  return unary_saving_input("gelu", x, pw::Gelu{}, pw::GeluBackward{});
}

Tensor clamp(const Tensor& x, double lo, double hi, Site site) {
  const CallSite at("clamp", site);
  check(lo <= hi, "clamp: expected lo <= hi, got lo={} hi={}", lo, hi);
  return unary_saving_input("clamp", x, pw::Clamp{lo, hi}, pw::ClampBackward{lo, hi});
}

namespace {
// round_bf16 and round_fp16: an f32 tensor rounded by `round` (a pw:: functor), straight-through vjp
template <class Round>
Tensor round_16bit(const char* op, const Tensor& x, Site site) {
  const CallSite at(op, site);
  check(x.dtype() == DType::f32, "{}: expected an f32 tensor, got {}", op, x.dtype());
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  KERNEL(x.device(), map1, y.data<float>(), x.data<float>(), layout(x), Round{});
  record(op, {x}, y, [](const Tensor& g) { return std::vector{g}; });
  return y;
}
}  // namespace

Tensor round_bf16(const Tensor& x, Site site) { return round_16bit<pw::RoundBf16>("round_bf16", x, site); }
Tensor round_fp16(const Tensor& x, Site site) { return round_16bit<pw::RoundFp16>("round_fp16", x, site); }
Tensor round_operand(const Tensor& x, Precision p, Site site) {
  if (p == Precision::bf16) return round_bf16(x, site);
  if (p == Precision::fp16) return round_fp16(x, site);
  check(x.dtype() == DType::f32, "round_operand: expected an f32 tensor, got {}", x.dtype());
  return x;
}


Tensor maximum(const Tensor& a_, const Tensor& b_, Site site) {
  const CallSite at("maximum", site);
  auto [a, b] = broadcast("maximum", a_, b_);
  Tensor y = map_float2("maximum", a, b, pw::Maximum{});
  record("maximum", {a, b}, y, [a = a.detach(), b = b.detach()](const Tensor& g) {
    return std::vector{map_float3("maximum", a, b, g, pw::MaximumBackwardA{}),
                       map_float3("maximum", b, a, g, pw::MaximumBackwardA{})};
  });
  return y;
}

Tensor minimum(const Tensor& a_, const Tensor& b_, Site site) {
  const CallSite at("minimum", site);
  auto [a, b] = broadcast("minimum", a_, b_);
  Tensor y = map_float2("minimum", a, b, pw::Minimum{});
  record("minimum", {a, b}, y, [a = a.detach(), b = b.detach()](const Tensor& g) {
    return std::vector{map_float3("minimum", a, b, g, pw::MinimumBackwardA{}),
                       map_float3("minimum", b, a, g, pw::MinimumBackwardA{})};
  });
  return y;
}

// ---- comparisons and selection --------------------------------------------------------------
namespace {
template <class F>
Tensor compare(const char* op, const Tensor& a_, const Tensor& b_, F f) {
  check_same(op, a_, b_);
  Shape s = broadcast_shapes(op, a_.shape(), b_.shape());
  Tensor y = empty(s, DType::b8, a_.device());
  visit_dtype(op, a_.dtype(), [&]<class T>() {
    KERNEL(a_.device(), map2, y.data<bool>(), a_.data<T>(), layout_as(a_, s), b_.data<T>(), layout_as(b_, s), f);
  });
  return y;
}
}  // namespace

Tensor eq(const Tensor& a, const Tensor& b, Site site) {
  const CallSite at("eq", site);
  return compare("eq", a, b, pw::Eq{});
}
Tensor ne(const Tensor& a, const Tensor& b, Site site) {
  const CallSite at("ne", site);
  return compare("ne", a, b, pw::Ne{});
}
Tensor lt(const Tensor& a, const Tensor& b, Site site) {
  const CallSite at("lt", site);
  return compare("lt", a, b, pw::Lt{});
}
Tensor le(const Tensor& a, const Tensor& b, Site site) {
  const CallSite at("le", site);
  return compare("le", a, b, pw::Le{});
}
Tensor gt(const Tensor& a, const Tensor& b, Site site) {
  const CallSite at("gt", site);
  return compare("gt", a, b, pw::Gt{});
}
Tensor ge(const Tensor& a, const Tensor& b, Site site) {
  const CallSite at("ge", site);
  return compare("ge", a, b, pw::Ge{});
}
Tensor eq(const Tensor& a, double b, Site site) {
  const CallSite at("eq", site);
  return eq(a, scalar_like(b, a));
}
Tensor lt(const Tensor& a, double b, Site site) {
  const CallSite at("lt", site);
  return lt(a, scalar_like(b, a));
}
Tensor gt(const Tensor& a, double b, Site site) {
  const CallSite at("gt", site);
  return gt(a, scalar_like(b, a));
}

Tensor where(const Tensor& cond, const Tensor& a_, const Tensor& b_, Site site) {
  const CallSite at("where", site);
  check(cond.dtype() == DType::b8, "where: condition must be b8, got {}", cond.dtype());
  check(cond.device() == a_.device(), "where: condition on {} but values on {}", cond.device(), a_.device());
  check_same("where", a_, b_);
  Shape s = broadcast_shapes("where", broadcast_shapes("where", cond.shape(), a_.shape()), b_.shape());
  Tensor a = a_.expand(s), b = b_.expand(s);
  Tensor y = empty(s, a.dtype(), a.device());
  visit_dtype("where", a.dtype(), [&]<class T>() {
    KERNEL(a.device(), map3, y.data<T>(), cond.data<bool>(), layout_as(cond, s), a.data<T>(), layout(a),
           b.data<T>(), layout(b), pw::Where{});
  });
  record(
      "where", {a, b}, y,
      [c = cond](const Tensor& g) {
        Tensor zero = zeros({}, g.dtype(), g.device());
        return std::vector{where(c, g, zero), where(c, zero, g)};
      },
      OutputCheck::no_nan);  // selects values: an infinity in y was handed to it (a -inf mask)
  return y;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value, Site site) {
  const CallSite at("masked_fill", site);
  check(mask.dtype() == DType::b8, "masked_fill: mask must be b8, got {}", mask.dtype());
  check(broadcast_shapes("masked_fill", x.shape(), mask.shape()) == x.shape(),
        "masked_fill: mask of shape {} does not broadcast to input shape {}", mask.shape(), x.shape());
  return where(mask, scalar_tensor(value, x.dtype(), x.device()), x);
}

// ---- in-place (no history) ------------------------------------------------------------------
Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_writable("add_", *this);
  check_same("add_", *this, other);
  check(is_contiguous(), "add_: destination must be contiguous, got strides {} for shape {}", strides(), shape());
  check(broadcast_shapes("add_", other.shape(), shape()) == shape(),
        "add_: other of shape {} does not broadcast to destination shape {}", other.shape(), shape());
  Layout lo = layout_as(other, shape());
  visit_numeric("add_", dtype(), [&]<class T>() {
    T* d = data<T>();
    KERNEL(device(), map2, d, d, layout(*this), other.data<T>(), lo, pw::AddScaled{alpha});
  });
  mark_modified(*this);
  return *this;
}

Tensor& Tensor::mul_(double value) {
  check_writable("mul_", *this);
  check(is_contiguous(), "mul_: destination must be contiguous, got strides {} for shape {}", strides(), shape());
  visit_numeric("mul_", dtype(), [&]<class T>() {
    T* d = data<T>();
    KERNEL(device(), map1, d, d, layout(*this), pw::Scale{value});
  });
  mark_modified(*this);
  return *this;
}

}  // namespace ag
