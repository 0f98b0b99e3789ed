#pragma once
// ag::Tensor: a cheap handle (shared pointer) to shape, strides, offset, dtype and a shared
// Storage. Views (reshape, transpose, narrow, expand, ...) share the storage of their base.
//
// The boundary with autograd/. core/ stores each tensor's autograd fields (requires_grad, grad,
// grad_fn) and defines what only reads or sets them (requires_grad(), grad(), detach(), ...), but
// it records nothing. The methods in the two sections marked "autograd library" below (backward,
// views, copies, conversions, in-place writes) are differentiable or refuse writes the tape would
// miss: they are declared here, so that `x.reshape(...)` reads as in PyTorch, and defined next to
// their backward formulas in autograd/ (one op, one place). Code of core/ never calls them: the
// build links the core library alone and fails on any call that runs up a layer (CMakeLists.txt,
// "layer link checks"); core code uses the plain functions at the end of this file instead.
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/kernels.h"

namespace ag {

struct Node;  // autograd/tape.h: the recorded op that produced a tensor

// A block of memory on one device, shared by a tensor and all its views.
struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  uint64_t version = 0;  // bumped by in-place writes; lets the tape detect a modified saved tensor

  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

struct TensorImpl {
  Shape shape;
  Shape strides;        // in elements
  int64_t offset = 0;   // in elements, into storage
  DType dtype = DType::f32;
  std::shared_ptr<Storage> storage;

  // Autograd metadata. core/ only stores it; autograd/tape.cpp gives it meaning.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf
  std::shared_ptr<Node> grad_fn;     // the node that produced this tensor (null for leaves)
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata ------------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int dim) const;  // dim may be negative
  int64_t stride(int dim) const;
  int ndim() const { return impl().shape.size(); }
  int64_t numel() const { return impl().shape.numel(); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  bool is_contiguous() const;
  size_t nbytes() const { return size_t(numel()) * itemsize(dtype()); }

  // Typed pointer to the first element (offset applied); checks that T matches the dtype.
  template <class T> T* data() const {
    check(dtype_v<T> == dtype(), "data: tensor has dtype {}, asked for {}", dtype(), dtype_v<T>);
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // The single value of a one-element tensor, converted to T (copied to the host if needed).
  template <class T = float> T item() const;
  // All values in row-major order, converted to T (copied to the host if needed).
  template <class T = float> std::vector<T> to_vector() const;

  // ---- autograd fields (core/tensor.cpp): stored here, given meaning by autograd/ -------------
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& set_requires_grad(bool on = true);   // only on leaves of floating dtype
  Tensor grad() const;                          // undefined until a backward reached it
  void set_grad(const Tensor& g);               // undefined tensor clears it (zero_grad)
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  const std::shared_ptr<Node>& grad_fn() const { return impl().grad_fn; }
  Tensor detach() const;  // same storage, no history

  // ==== autograd library (autograd/tape.cpp) =================================================
  // Backpropagates from this tensor: a scalar needs no gradient, others need one of their shape.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

  // ==== autograd library (autograd/ops/view.cpp, elementwise.cpp) ============================
  // ---- views: no copy, shared storage ----------------------------------------------------------
  Tensor reshape(const Shape& shape) const;  // a view when the strides allow it, else a copy
  Tensor view(const Shape& shape) const;     // a view, or an error when the strides forbid it
  Tensor flatten(int start_dim = 0, int end_dim = -1) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int dim0, int dim1) const;
  Tensor mT() const { return transpose(-2, -1); }  // transpose of the last two dims
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor slice(int dim, int64_t start, int64_t end, int64_t step = 1) const;  // python x[a:b:s]
  Tensor select(int dim, int64_t index) const;  // removes dim
  Tensor unsqueeze(int dim) const;
  Tensor squeeze(int dim) const;  // only when that dim has size 1
  Tensor squeeze() const;         // every size-1 dim
  Tensor expand(const Shape& shape) const;  // -1 keeps a dim; broadcasting rules
  Tensor contiguous() const;  // this tensor when already contiguous, else a copy
  Tensor clone() const;       // always a copy (differentiable)

  // ---- conversion -----------------------------------------------------------------------------
  Tensor to(Device device) const;  // differentiable copy across devices
  Tensor to(DType dtype) const;    // differentiable between floating dtypes
  Tensor cpu() const { return to(Device::cpu()); }

  // ---- in-place writes; refused on tensors with history (autograd's check_writable) ---------
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // src broadcast to this tensor's shape
  Tensor& add_(const Tensor& other, double alpha = 1.0);  // this += alpha * other
  Tensor& mul_(double value);

  TensorImpl& impl() const {
    check(impl_ != nullptr, "tensor: use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// ---- creation (core/tensor.cpp) ---------------------------------------------------------------
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// [start, end) in steps of step, as torch.arange.
Tensor arange(double start, double end, double step = 1, DType dtype = DType::i64,
              Device device = Device::cpu());
inline Tensor arange(double end, DType dtype = DType::i64) { return arange(0, end, 1, dtype); }
// A tensor holding `values` with `shape` (default: 1-D); dtype follows T.
template <class T>
Tensor from_vector(std::span<const T> values, const Shape& shape, Device device = Device::cpu());
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu()) {
  return from_vector<T>(std::span<const T>(values), shape, device);
}
template <class T>
Tensor from_vector(const std::vector<T>& values) {
  return from_vector<T>(std::span<const T>(values), Shape{int64_t(values.size())});
}
// tensor({1, 2, 3}) and tensor({1.f, 2.f}) are f32; tensor<double>({...}, {2, 2}) is f64 of shape
// [2,2]; tensor<int64_t>({...}) is i64 and tensor<bool>({...}) b8. No shape means 1-D.
template <class T = float>
Tensor tensor(std::initializer_list<T> values, const Shape& shape = {}) {
  const Shape s = shape.empty() ? Shape{int64_t(values.size())} : shape;
  if constexpr (std::is_same_v<T, int>) {  // plain integer literals: f32, like float literals
    std::vector<float> f(values.begin(), values.end());
    return from_vector<float>(std::span<const float>(f), s);
  } else {
    return from_vector<T>(std::span<const T>(values.begin(), values.size()), s);
  }
}
// A 0-dim tensor holding `value`.
Tensor scalar_tensor(double value, DType dtype = DType::f32, Device device = Device::cpu());

// A view of `base`'s storage with the given geometry (no autograd; checked against the storage).
Tensor as_strided(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

}  // namespace ag

namespace ag {
// The kernel's view of a tensor's geometry (core/kernels.h).
Layout layout(const Tensor& t);
// The same tensor seen with `shape` by broadcasting (stride 0 on broadcast dims).
Layout layout_as(const Tensor& t, const Shape& shape);
// A contiguous copy of `t` on the CPU, dtype unchanged (no autograd); `t` itself when it already is.
Tensor host_contiguous(const Tensor& t);
// A contiguous copy of `t` with its elements converted to `dtype` (storage_cast, core/half.h: 16-bit
// values through their f32, rounding to nearest even), on t's device, no autograd: what
// Tensor::to(DType) computes before it records the conversion.
Tensor cast(const Tensor& t, DType dtype);

// Every in-place write calls this once it has written `t`: it bumps the version of t's storage,
// which the tape compares with the version it saw when an op saved the tensor (autograd/tape.h),
// so backward refuses to use a value that changed under it. One place, so no writer can forget
// the bump and silently switch the check off (in-place ops, optimizers, gradient clipping).
inline void mark_modified(const Tensor& t) { ++t.impl().storage->version; }
}  // namespace ag
