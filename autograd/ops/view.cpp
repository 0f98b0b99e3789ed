// Views, copies and in-place writes. Views share storage; each records a backward that maps the
// output gradient back to the input's geometry (math in autograd/ops.h).
#include <numeric>

#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/dispatch.h"

namespace ag {

namespace {

// Strides for viewing (shape, strides) as `target` without a copy, or false when impossible
// (the same algorithm as NumPy/PyTorch: split/merge runs of dims that are contiguous in memory).
bool view_strides(const Shape& shape, const Shape& strides, const Shape& target, Shape& out) {
  out = target;
  if (shape.numel() == 0 || shape.size() == 0) {  // nothing to keep in order, or one element
    out = contiguous_strides(target);
    return true;
  }
  int view_d = target.size() - 1;
  int64_t chunk_base_stride = strides.size() ? strides.back() : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    // a chunk ends at d == 0 or where dims d-1 and d are not contiguous with each other
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || target[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= target[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

// Resolves one -1 in a requested shape against numel.
Shape infer_shape(const char* op, const Shape& in, const Shape& req) {
  Shape s = req;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      check(infer < 0, "{}: only one dim can be -1, got {}", op, req);
      infer = i;
    } else {
      check(s[i] >= 0, "{}: invalid size {} in shape {}", op, s[i], req);
      known *= s[i];
    }
  }
  if (infer >= 0) {
    check(known != 0 && in.numel() % known == 0, "{}: shape {} is invalid for input of shape {}", op, req, in);
    s[infer] = in.numel() / known;
  }
  check(s.numel() == in.numel(), "{}: shape {} is invalid for input of shape {} ({} elements)", op, req, in,
        in.numel());
  return s;
}

// y = view of x with (shape, strides, offset), recorded with backward `fn`.
Tensor make_view(const char* op, const Tensor& x, const Shape& shape, const Shape& strides, int64_t offset,
                 BackwardFn fn) {
  Tensor y = as_strided(x, shape, strides, offset);
  record(op, {x}, y, std::move(fn), OutputCheck::none);  // a view makes no new values
  return y;
}

}  // namespace

// ---- reshape family -------------------------------------------------------------------------
Tensor Tensor::view(const Shape& req) const {
  Shape shape = infer_shape("view", this->shape(), req), strides;
  check(view_strides(this->shape(), this->strides(), shape, strides),
        "view: cannot view shape {} (strides {}) as {} without a copy; use reshape()", this->shape(),
        this->strides(), shape);
  Shape in = this->shape();
  return make_view("view", *this, shape, strides, offset(), [in](const Tensor& g) {
    return std::vector{g.reshape(in)};
  });
}

Tensor Tensor::reshape(const Shape& req) const {
  Shape shape = infer_shape("reshape", this->shape(), req), strides;
  if (view_strides(this->shape(), this->strides(), shape, strides)) return view(shape);
  return contiguous().view(shape);
}
Tensor reshape(const Tensor& x, const Shape& shape, Site site) {
  const CallSite at("reshape", site);
  return x.reshape(shape);
}

Tensor Tensor::flatten(int start_dim, int end_dim) const {
  if (ndim() == 0) return reshape({1});
  int s = wrap_dim("flatten", start_dim, ndim()), e = wrap_dim("flatten", end_dim, ndim());
  check(s <= e, "flatten: start_dim {} is after end_dim {}", start_dim, end_dim);
  Shape out;
  for (int i = 0; i < s; ++i) out.push_back(shape()[i]);
  int64_t n = 1;
  for (int i = s; i <= e; ++i) n *= shape()[i];
  out.push_back(n);
  for (int i = e + 1; i < ndim(); ++i) out.push_back(shape()[i]);
  return reshape(out);
}

Tensor Tensor::unsqueeze(int dim) const {
  int d = wrap_dim("unsqueeze", dim, ndim() + 1);
  Shape shape = this->shape(), strides = this->strides();
  int64_t st = d < ndim() ? strides[d] * shape[d] : 1;
  shape.insert(d, 1);
  strides.insert(d, st);
  Shape in = this->shape();
  return make_view("unsqueeze", *this, shape, strides, offset(), [in](const Tensor& g) {
    return std::vector{g.reshape(in)};
  });
}
Tensor unsqueeze(const Tensor& x, int dim, Site site) {
  const CallSite at("unsqueeze", site);
  return x.unsqueeze(dim);
}

Tensor Tensor::squeeze(int dim) const {
  int d = wrap_dim("squeeze", dim, ndim());
  check(shape()[d] == 1, "squeeze: dim {} has size {}, not 1 (shape {})", dim, shape()[d], shape());
  Shape shape = this->shape(), strides = this->strides();
  shape.erase(d);
  strides.erase(d);
  Shape in = this->shape();
  return make_view("squeeze", *this, shape, strides, offset(), [in](const Tensor& g) {
    return std::vector{g.reshape(in)};
  });
}
Tensor squeeze(const Tensor& x, int dim, Site site) {
  const CallSite at("squeeze", site);
  return x.squeeze(dim);
}

Tensor Tensor::squeeze() const {
  Shape shape;
  for (int64_t d : this->shape())
    if (d != 1) shape.push_back(d);
  return reshape(shape);
}

// ---- permutations -----------------------------------------------------------------------------
Tensor Tensor::permute(const Shape& dims) const {
  check(dims.size() == ndim(), "permute: {} dims given for a tensor of shape {}", dims.size(), shape());
  Shape shape, strides, inverse = dims;
  bool seen[kMaxDims] = {};
  for (int i = 0; i < ndim(); ++i) {
    int d = wrap_dim("permute", dims[i], ndim());
    check(!seen[d], "permute: dim {} repeated in {}", d, dims);
    seen[d] = true;
    shape.push_back(this->shape()[d]);
    strides.push_back(this->strides()[d]);
    inverse[d] = i;
  }
  return make_view("permute", *this, shape, strides, offset(), [inverse](const Tensor& g) {
    return std::vector{g.permute(inverse)};
  });
}
Tensor permute(const Tensor& x, const Shape& dims, Site site) {
  const CallSite at("permute", site);
  return x.permute(dims);
}

Tensor Tensor::transpose(int dim0, int dim1) const {
  int a = wrap_dim("transpose", dim0, ndim()), b = wrap_dim("transpose", dim1, ndim());
  Shape dims;
  for (int i = 0; i < ndim(); ++i) dims.push_back(i);
  std::swap(dims[a], dims[b]);
  return permute(dims);
}
Tensor transpose(const Tensor& x, int dim0, int dim1, Site site) {
  const CallSite at("transpose", site);
  return x.transpose(dim0, dim1);
}

// ---- slicing -------------------------------------------------------------------------------
Tensor Tensor::slice(int dim, int64_t start, int64_t end, int64_t step) const {
  int d = wrap_dim("slice", dim, ndim());
  check(step >= 1, "slice: step must be >= 1, got {}", step);
  const int64_t n = shape()[d];
  // Python semantics: negative indices count from the end; out-of-range bounds are clamped.
  auto clampi = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  int64_t s = clampi(start), e = std::max(clampi(end), s);
  Shape shape = this->shape(), strides = this->strides();
  shape[d] = (e - s + step - 1) / step;
  strides[d] *= step;
  Shape in = this->shape();
  Tensor y = make_view("slice", *this, shape, strides, offset() + s * this->strides()[d],
                       [in, d, s, e, step](const Tensor& g) {
                         Tensor dx = zeros(in, g.dtype(), g.device());
                         dx.slice(d, s, e, step).copy_(g);
                         return std::vector{dx};
                       });
  if (const auto& node = y.grad_fn()) node->slice_of_input = Node::SliceOfInput{d, s, e, step, false};
  return y;
}
Tensor slice(const Tensor& x, int dim, int64_t start, int64_t end, int64_t step, Site site) {
  const CallSite at("slice", site);
  return x.slice(dim, start, end, step);
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const {
  int d = wrap_dim("narrow", dim, ndim());
  check(start >= 0 && length >= 0 && start + length <= shape()[d],
        "narrow: [{}, {}) is out of range for dim {} of size {} (shape {})", start, start + length, dim,
        shape()[d], shape());
  return slice(d, start, start + length);
}
Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length, Site site) {
  const CallSite at("narrow", site);
  return x.narrow(dim, start, length);
}

Tensor Tensor::select(int dim, int64_t index) const {
  int d = wrap_dim("select", dim, ndim());
  const int64_t n = shape()[d];
  check(index >= -n && index < n, "select: index {} is out of range for dim {} of size {} (shape {})", index,
        dim, n, shape());
  int64_t i = index < 0 ? index + n : index;
  Shape shape = this->shape(), strides = this->strides();
  shape.erase(d);
  strides.erase(d);
  Shape in = this->shape();
  Tensor y = make_view("select", *this, shape, strides, offset() + i * this->strides()[d], [in, d, i](const Tensor& g) {
    Tensor dx = zeros(in, g.dtype(), g.device());
    dx.select(d, i).copy_(g);
    return std::vector{dx};
  });
  if (const auto& node = y.grad_fn()) node->slice_of_input = Node::SliceOfInput{d, i, i + 1, 1, true};
  return y;
}
Tensor select(const Tensor& x, int dim, int64_t index, Site site) {
  const CallSite at("select", site);
  return x.select(dim, index);
}

// ---- broadcasting --------------------------------------------------------------------------
Tensor Tensor::expand(const Shape& req) const {
  check(req.size() >= ndim(), "expand: cannot expand shape {} to fewer dims {}", shape(), req);
  Shape target = req;
  const int lead = req.size() - ndim();
  for (int i = 0; i < req.size(); ++i) {
    if (req[i] == -1) {
      check(i >= lead, "expand: -1 is not allowed for a new leading dim in {}", req);
      target[i] = shape()[i - lead];
    }
  }
  for (int i = 0; i < target.size(); ++i) {
    const int j = i - lead;  // the matching dim of this tensor, when j >= 0
    check(target[i] >= 0, "expand: invalid size {} in {}", target[i], req);
    const int64_t have = j < 0 ? 1 : shape()[j];
    check(have == 1 || have == target[i], "expand: cannot expand shape {} to {} (dim {}: size {} is not 1)",
          shape(), req, i, have);
  }
  if (target == shape()) return *this;
  Layout l = layout_as(*this, target);
  Shape strides;
  for (int i = 0; i < target.size(); ++i) strides.push_back(l.strides[i]);
  Shape in = shape();
  return make_view("expand", *this, target, strides, offset(), [in](const Tensor& g) {
    return std::vector{sum_to(g, in)};
  });
}
Tensor expand(const Tensor& x, const Shape& shape, Site site) {
  const CallSite at("expand", site);
  return x.expand(shape);
}
Tensor broadcast_to(const Tensor& x, const Shape& shape, Site site) {
  const CallSite at("broadcast_to", site);
  return x.expand(shape);
}

Tensor sum_to(const Tensor& x, const Shape& shape, Site site) {
  const CallSite at("sum_to", site);
  if (x.shape() == shape) return x;
  const int lead = x.ndim() - shape.size();
  check(lead >= 0, "sum_to: cannot reduce shape {} to {}", x.shape(), shape);
  std::vector<int> dims;
  for (int i = 0; i < x.ndim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else if (shape[i - lead] == 1 && x.shape()[i] != 1) {
      dims.push_back(i);
    } else {
      check(shape[i - lead] == x.shape()[i], "sum_to: cannot reduce shape {} to {}", x.shape(), shape);
    }
  }
  return sum(x, dims, true).reshape(shape);
}

// ---- copies ------------------------------------------------------------------------------
Tensor Tensor::clone() const {
  Tensor y = empty(shape(), dtype(), device());
  visit_storage(dtype(), [&]<class T>() { KERNEL(device(), cast_copy, y.data<T>(), data<T>(), layout(*this)); });
  record("clone", {*this}, y, [](const Tensor& g) { return std::vector{g}; });
  return y;
}
Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  check(!(is_half(target) && requires_grad() && grad_enabled()),
        "to: a {} tensor carries no gradient, and this {} tensor of shape {} requires one: detach() it first, or "
        "compute under autocast (ag::AutocastGuard), whose products read 16-bit operands and pass gradients",
        name(target), name(dtype()), shape());
  Tensor y = cast(*this, target);
  if (is_floating(target) && is_floating(dtype())) {
    DType from = dtype();
    record("to_dtype", {*this}, y, [from](const Tensor& g) { return std::vector{g.to(from)}; });
  }
  return y;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor src = contiguous();
  Tensor y = empty(shape(), dtype(), target);
  device_copy(y.raw_data(), target, src.raw_data(), src.device(), nbytes());
  Device from = device();
  record("to_device", {*this}, y, [from](const Tensor& g) { return std::vector{g.to(from)}; });
  return y;
}

// ---- in-place ------------------------------------------------------------------------------
Tensor& Tensor::fill_(double value) {
  check_writable("fill_", *this);
  visit_storage(dtype(), [&]<class T>() { KERNEL(device(), fill<T>, data<T>(), layout(*this), storage_cast<T>(value)); });
  mark_modified(*this);
  return *this;
}
Tensor& Tensor::zero_() { return fill_(0); }

Tensor& Tensor::copy_(const Tensor& src) {
  check_writable("copy_", *this);
  check(src.device() == device(), "copy_: source on {} but destination on {}", src.device(), device());
  check(broadcast_shapes("copy_", src.shape(), shape()) == shape(),
        "copy_: source of shape {} does not broadcast to destination shape {}", src.shape(), shape());
  Tensor s = src.dtype() == dtype() ? src : src.detach().to(dtype());
  Layout ls = layout_as(s, shape());
  visit_storage(dtype(), [&]<class T>() { KERNEL(device(), strided_copy<T>, data<T>(), layout(*this), s.data<T>(), ls); });
  mark_modified(*this);
  return *this;
}

}  // namespace ag
