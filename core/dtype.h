#pragma once
// DType, Device and Shape: the small value types every tensor carries.
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "core/half.h"  // bf16, f16

namespace ag {

// ---- dtype --------------------------------------------------------------------------------
// f32 is the default; f64 is for gradient checks on the CPU; i64 holds indices and labels;
// b8 (one byte, 0 or 1) is what comparisons return and what masks are. bf16 and f16 (core/half.h)
// are storage: half the bytes of f32 for weights, activations kept for backward and caches. They
// are created, converted (.to), copied, viewed, printed and saved like any tensor, and read by the
// 16-bit products (matmul, linear, attention); the other ops compute in f32 or f64 and ask for a
// conversion, naming themselves and the dtype.
enum class DType : uint8_t { f32, f64, i64, b8, bf16, f16 };

inline constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i64: return 8;
    case DType::b8: return 1;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}
inline constexpr const char* name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i64: return "i64";
    case DType::b8: return "b8";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}
// The dtypes the ops compute in (and gradients flow through): f32 and f64.
inline constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f64; }
inline constexpr bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::b8; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

// The error of an op given a 16-bit tensor it does not compute in.
[[noreturn]] inline void fail_half(const char* op, DType t) {
  fail("{}: {} tensors are storage (matmul, linear and attention read them); convert with .to(DType::f32) "
       "for this op",
       op, name(t));
}

// Calls f.template operator()<T>() with the C++ type of `t` (bool for b8), for the dtypes the ops
// compute in; `op` names the caller in the error for a 16-bit tensor:
//   visit_dtype("fill_", x.dtype(), [&]<class T>() { cpu::fill<T>(x.data<T>(), ...); });
template <class F>
decltype(auto) visit_dtype(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::b8: return f.template operator()<bool>();
    case DType::bf16:
    case DType::f16: fail_half(op, t);
  }
  fail("internal: unknown dtype {}", int(t));
}
// Every dtype, the 16-bit storage types included (ag::bf16, ag::f16): for the code that moves
// or converts elements without computing on them (copies, casts, fills, concatenation).
template <class F>
decltype(auto) visit_storage(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::b8: return f.template operator()<bool>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::f16: return f.template operator()<f16>();
  }
  fail("internal: unknown dtype {}", int(t));
}
// The same for the floating dtypes only; `op` names the caller in the error.
template <class F>
decltype(auto) visit_floating(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::bf16:
    case DType::f16: fail_half(op, t);
    default: fail("{}: expected a floating dtype (f32 or f64), got {}", op, name(t));
  }
}
// Floating or i64: the dtypes arithmetic is defined for.
template <class F>
decltype(auto) visit_numeric(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::bf16:
    case DType::f16: fail_half(op, t);
    default: fail("{}: expected a numeric dtype (f32, f64 or i64), got {}", op, name(t));
  }
}

// ---- device -------------------------------------------------------------------------------
struct Device {
  enum Type : uint8_t { CPU, CUDA };
  Type type = CPU;
  int index = 0;

  static Device cpu() { return {CPU, 0}; }
  static Device cuda(int i = 0) { return {CUDA, i}; }
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:1"
  bool is_cpu() const { return type == CPU; }
  bool is_cuda() const { return type == CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }
};

// ---- shape --------------------------------------------------------------------------------
inline constexpr int kMaxDims = 8;

// A fixed-capacity list of up to kMaxDims int64 (used for shapes and strides): no heap
// allocation, so creating a tensor's metadata costs no malloc for the dims.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { for (int64_t d : dims) push_back(d); }
  explicit Shape(std::span<const int64_t> dims) { for (int64_t d : dims) push_back(d); }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t back() const { return d_[n_ - 1]; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  const int64_t* data() const { return d_; }

  void push_back(int64_t v) {
    check(n_ < kMaxDims, "shape: at most {} dimensions are supported", kMaxDims);
    d_[n_++] = v;
  }
  void insert(int pos, int64_t v) {
    check(n_ < kMaxDims, "shape: at most {} dimensions are supported", kMaxDims);
    for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
    d_[pos] = v;
    ++n_;
  }
  void erase(int pos) {
    for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
    --n_;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < n_; ++i) n *= d_[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (n_ != o.n_) return false;
    for (int i = 0; i < n_; ++i)
      if (d_[i] != o.d_[i]) return false;
    return true;
  }

 private:
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

// Row-major (C-contiguous) strides of a shape, in elements.
inline Shape contiguous_strides(const Shape& shape) {
  Shape s = shape;
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i] > 0 ? shape[i] : 1;
  }
  return s;
}

// Wraps a possibly negative dim into [0, ndim); `op` names the caller in the error.
inline int wrap_dim(const char* op, int64_t dim, int ndim) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  check(d >= 0 && d < ndim, "{}: dim {} is out of range for a tensor with {} dims", op, dim, ndim);
  return int(d);
}

// NumPy broadcasting of two shapes; `op` names the caller in the error.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

}  // namespace ag

template <>
struct fmt::formatter<ag::Shape> : fmt::formatter<std::string_view> {
  auto format(const ag::Shape& s, format_context& ctx) const {
    auto out = ctx.out();
    *out++ = '[';
    for (int i = 0; i < s.size(); ++i) {
      if (i) *out++ = ',';
      out = fmt::format_to(out, "{}", s[i]);
    }
    *out++ = ']';
    return out;
  }
};
template <>
struct fmt::formatter<ag::DType> : fmt::formatter<std::string_view> {
  auto format(ag::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(ag::name(t), ctx);
  }
};
template <>
struct fmt::formatter<ag::Device> : fmt::formatter<std::string_view> {
  auto format(const ag::Device& d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
