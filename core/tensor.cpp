// Tensor metadata, storage, autograd fields, creation and host read-back. Differentiable methods
// live in autograd/ (core/tensor.h says which).
#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/allocator.h"
#include "core/dispatch.h"

namespace ag {

// ---- storage ------------------------------------------------------------------------------------
Storage::Storage(size_t nbytes, Device dev) : bytes(nbytes), device(dev) {
  ptr = device_alloc(dev, nbytes);
}
Storage::~Storage() { device_free(device, ptr, bytes); }

// ---- shapes ---------------------------------------------------------------------------------
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  int n = std::max(a.size(), b.size());
  Shape out;
  for (int i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    check(da == db || da == 1 || db == 1,
          "{}: shapes {} and {} cannot be broadcast (dim {}: {} vs {})", op, a, b, i, da, db);
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  // "cuda:N" with N plain decimal digits (no sign, no spaces), at most 9 of them
  const std::string n = s.rfind("cuda:", 0) == 0 ? s.substr(5) : std::string();
  bool digits = !n.empty() && n.size() <= 9;
  for (char c : n) digits = digits && c >= '0' && c <= '9';
  check(digits, "device: cannot parse '{}' (expected cpu, cuda or cuda:N)", s);
  return cuda(std::stoi(n));
}

// ---- metadata -------------------------------------------------------------------------------
int64_t Tensor::size(int dim) const { return shape()[wrap_dim("size", dim, ndim())]; }
int64_t Tensor::stride(int dim) const { return strides()[wrap_dim("stride", dim, ndim())]; }

// An empty tensor is contiguous whatever its strides (there is nothing to be out of order).
bool Tensor::is_contiguous() const { return numel() == 0 || layout(*this).is_contiguous(); }

void* Tensor::raw_data() const {
  const TensorImpl& t = impl();
  return static_cast<char*>(t.storage->ptr) + t.offset * int64_t(itemsize(t.dtype));
}

// ---- autograd fields: stored here, given meaning by autograd/tape.cpp --------------------------
Tensor& Tensor::set_requires_grad(bool on) {
  check(!on || is_floating(dtype()), "requires_grad: only floating tensors can require grad, got {}", dtype());
  check(is_leaf(), "requires_grad: only leaves can change requires_grad; use detach() for a new leaf");
  impl().requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return Tensor(impl().grad); }

void Tensor::set_grad(const Tensor& g) {
  check(!g.defined() || g.shape() == shape(), "set_grad: gradient shape {} differs from tensor shape {}",
        g.defined() ? g.shape() : Shape{}, shape());
  check(!g.defined() || g.dtype() == dtype(), "set_grad: gradient dtype {} differs from tensor dtype {}",
        g.defined() ? g.dtype() : dtype(), dtype());
  impl().grad = g.impl_ptr();
}

Tensor Tensor::detach() const {
  auto d = std::make_shared<TensorImpl>();
  d->shape = shape();
  d->strides = strides();
  d->offset = offset();
  d->dtype = dtype();
  d->storage = impl().storage;
  return Tensor(std::move(d));
}

Layout layout(const Tensor& t) {
  Layout l;
  l.ndim = t.ndim();
  for (int i = 0; i < l.ndim; ++i) {
    l.shape[i] = t.shape()[i];
    l.strides[i] = t.strides()[i];
  }
  return l;
}

Layout layout_as(const Tensor& t, const Shape& shape) {
  const int n = shape.size(), k = t.ndim();
  check(k <= n, "broadcast: cannot broadcast shape {} to {}", t.shape(), shape);
  Layout l;
  l.ndim = n;
  for (int i = 0; i < n; ++i) {
    int j = i - (n - k);
    int64_t d = j < 0 ? 1 : t.shape()[j];
    check(d == shape[i] || d == 1, "broadcast: cannot broadcast shape {} to {}", t.shape(), shape);
    l.shape[i] = shape[i];
    l.strides[i] = (j < 0 || d != shape[i]) ? 0 : t.strides()[j];
  }
  return l;
}

// ---- creation -------------------------------------------------------------------------------
Tensor empty(const Shape& shape, DType dtype, Device device) {
  int64_t bytes = int64_t(itemsize(dtype));
  for (int64_t d : shape) {
    check(d >= 0, "empty: negative dimension in shape {}", shape);
    check(!__builtin_mul_overflow(bytes, d, &bytes) && bytes <= (int64_t(1) << 62),
          "empty: shape {} of {} is too large to allocate", shape, dtype);
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(size_t(shape.numel()) * itemsize(dtype), device);
  return Tensor(std::move(impl));
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  visit_storage(dtype, [&]<class T>() { KERNEL(device, fill<T>, t.data<T>(), layout(t), storage_cast<T>(value)); });
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1, dtype, device); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); }
Tensor scalar_tensor(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  check(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
        "arange: start {}, end {} and step {} must be finite", start, end, step);
  check(step != 0, "arange: step must be nonzero");
  check((end - start) / step >= 0, "arange: start {} cannot reach end {} with step {}", start, end, step);
  int64_t n = int64_t(std::ceil((end - start) / step));
  Tensor t = empty({n}, dtype, device);
  visit_numeric("arange", dtype, [&]<class T>() { KERNEL(device, arange<T>, t.data<T>(), n, start, step); });
  return t;
}

template <class T>
Tensor from_vector(std::span<const T> values, const Shape& shape, Device device) {
  check(int64_t(values.size()) == shape.numel(), "from_vector: {} values do not fill shape {} ({} elements)",
        values.size(), shape, shape.numel());
  Tensor host = empty(shape, dtype_v<T>);
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  if (device.is_cpu()) return host;
  Tensor t = empty(shape, dtype_v<T>, device);
  if (!values.empty()) device_copy(t.raw_data(), device, host.raw_data(), Device::cpu(), host.nbytes());
  return t;
}
template Tensor from_vector<float>(std::span<const float>, const Shape&, Device);
template Tensor from_vector<double>(std::span<const double>, const Shape&, Device);
template Tensor from_vector<int64_t>(std::span<const int64_t>, const Shape&, Device);
template Tensor from_vector<bool>(std::span<const bool>, const Shape&, Device);

Tensor as_strided(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  check(shape.size() == strides.size(), "as_strided: shape {} and strides {} differ in rank", shape, strides);
  // Bounds: the furthest element must lie inside the storage.
  int64_t lo = offset, hi = offset;
  bool empty_view = false;
  for (int i = 0; i < shape.size(); ++i) {
    check(shape[i] >= 0, "as_strided: negative dimension in shape {}", shape);
    if (shape[i] == 0) empty_view = true;
    int64_t reach = (shape[i] - 1) * strides[i];
    (reach < 0 ? lo : hi) += reach;
  }
  const int64_t capacity = int64_t(base.impl().storage->bytes / itemsize(base.dtype()));
  check(empty_view || (lo >= 0 && hi < capacity),
        "as_strided: view shape {} strides {} offset {} reaches outside storage of {} elements", shape,
        strides, offset, capacity);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->storage = base.impl().storage;
  return Tensor(std::move(impl));
}

// ---- host read-back -------------------------------------------------------------------------
Tensor host_contiguous(const Tensor& t) {
  Tensor src = t;
  if (!t.device().is_cpu()) {
    if (!t.is_contiguous()) {  // a view: gathered on its device first, then one copy of just its elements
      src = empty(t.shape(), t.dtype(), t.device());
      visit_storage(t.dtype(), [&]<class T>() { KERNEL(t.device(), cast_copy, src.data<T>(), t.data<T>(), layout(t)); });
    }
    Tensor h = empty(t.shape(), t.dtype());
    device_copy(h.raw_data(), Device::cpu(), src.raw_data(), src.device(), src.nbytes());
    return h;
  }
  if (src.is_contiguous()) return src;
  Tensor out = empty(t.shape(), t.dtype());
  visit_storage(t.dtype(), [&]<class T>() { cpu::cast_copy<T, T>(out.data<T>(), src.data<T>(), layout(src)); });
  return out;
}

Tensor cast(const Tensor& t, DType dtype) {
  Tensor y = empty(t.shape(), dtype, t.device());
  visit_storage(dtype, [&]<class To>() {
    visit_storage(t.dtype(), [&]<class From>() { KERNEL(t.device(), cast_copy, y.data<To>(), t.data<From>(), layout(t)); });
  });
  return y;
}

// static_cast<T>(v), defined for every v: a float going to an integer type is truncated toward
// zero to int64 first (NaN -> 0, beyond int64's range -> its nearest end), then wrapped into T as
// C++20 integer conversion does (-2.5 -> -2 -> 254 as uint8, PyTorch's result on x86). A plain
// cast of NaN, 1e30 or -2.5 to uint8 is undefined behaviour (UBSan's float-cast-overflow).
namespace {
template <class T, class S>
T convert(S v) {
  if constexpr (is_half_v<S>) {
    return convert<T>(float(v));  // exact
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (std::isnan(v)) return T(0);
    if (v >= S(0x1p63)) return T(std::numeric_limits<int64_t>::max());
    if (v < S(-0x1p63)) return T(std::numeric_limits<int64_t>::min());
    return T(int64_t(v));
  } else {
    return static_cast<T>(v);
  }
}
}  // namespace

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor h = host_contiguous(*this);
  std::vector<T> out(size_t(h.numel()));
  visit_storage(h.dtype(), [&]<class S>() {
    const S* p = h.data<S>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = convert<T>(p[i]);
  });
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int> Tensor::to_vector<int>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

template <class T>
T Tensor::item() const {
  check(numel() == 1, "item: expected a tensor with one element, got shape {}", shape());
  Tensor h = host_contiguous(*this);
  return visit_storage(h.dtype(), [&]<class S>() { return convert<T>(*h.data<S>()); });
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template int Tensor::item<int>() const;
template bool Tensor::item<bool>() const;

}  // namespace ag
