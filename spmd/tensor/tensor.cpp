// spmd/tensor/tensor.cpp: Tensor's metadata, views, copies, element access and printing.
#include <spmd/tensor/tensor.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <optional>
#include <ostream>

#include <spmd/core/check.h>
#include <spmd/tensor/autograd_meta.h>
#include <spmd/tensor/device_ops.h>
#include <spmd/tensor/factory.h>
#include <spmd/tensor/meta.h>

namespace spmd {
namespace {

// The lowest and one-past-highest element offsets a view reaches (relative to the storage).
struct Extent {
  int64_t lo;
  int64_t hi;
};

Extent extent_of(const Shape& shape, const Strides& strides, int64_t offset) {
  Extent e{offset, offset + 1};
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const int64_t span = (shape[d] - 1) * strides[d];
    if (span < 0) {
      e.lo += span;
    } else {
      e.hi += span;
    }
  }
  return e;
}

// True when two elements of the view share memory through a broadcast (stride 0) dim.
bool has_broadcast_dim(const Shape& shape, const Strides& strides) {
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (strides[d] == 0 && shape[d] > 1) return true;
  }
  return false;
}

// ATen's computeStride: strides that let a tensor of (old_shape, old_strides) be viewed as
// new_shape, or nullopt when the memory layout does not allow it. Both shapes hold as many
// elements.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides,
                                    const Shape& new_shape) {
  if (old_shape.empty()) return Strides(new_shape.size(), 1);
  if (shape_numel(old_shape) == 0) {
    return old_shape == new_shape ? old_strides : contiguous_strides(new_shape);
  }
  Strides new_strides(new_shape.size());
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    const auto td = static_cast<std::size_t>(tensor_d);
    tensor_numel *= old_shape[td];
    // A chunk of dims that are contiguous among themselves ends here.
    if (tensor_d == 0 ||
        (old_shape[td - 1] != 1 && old_strides[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 &&
             (view_numel < tensor_numel || new_shape[static_cast<std::size_t>(view_d)] == 1)) {
        new_strides[static_cast<std::size_t>(view_d)] = view_numel * chunk_base_stride;
        view_numel *= new_shape[static_cast<std::size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

// `shape` with its -1 (if any) replaced so it holds `numel` elements.
Shape infer_shape(const char* op, Shape shape, int64_t numel, const Shape& from) {
  std::optional<std::size_t> infer;
  int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer) {
        throw_error<ShapeError>("{}: only one size may be -1, got shape {}", op, shape_str(shape));
      }
      infer = i;
    } else if (shape[i] < 0) {
      throw_error<ShapeError>("{}: invalid size {} in shape {}", op, shape[i], shape_str(shape));
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      throw_error<ShapeError>("{}: shape {} is invalid for {} elements (input shape {})", op,
                              shape_str(shape), numel, shape_str(from));
    }
  }
  if (infer) {
    if (known == 0 || numel % known != 0) {
      throw_error<ShapeError>("{}: shape {} is invalid for {} elements (input shape {})", op,
                              shape_str(shape), numel, shape_str(from));
    }
    shape[*infer] = numel / known;
  } else if (known != numel) {
    throw_error<ShapeError>("{}: shape {} is invalid for {} elements (input shape {})", op,
                            shape_str(shape), numel, shape_str(from));
  }
  return shape;
}

}  // namespace

std::shared_ptr<const Tensor::Meta> Tensor::empty_meta() {
  static const Meta kEmpty;
  // Aliasing constructor with no owner: copies of this pointer never touch a reference count.
  return std::shared_ptr<const Meta>(std::shared_ptr<const Meta>(), &kEmpty);
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset,
               DType dtype)
    : storage_(std::move(storage)), offset_(offset), dtype_(dtype) {
  auto fail = [&](std::string_view why) {
    throw_error<ShapeError>("Tensor: {} (shape {}, strides {}, offset {}, storage of {} bytes)",
                            why, shape_str(shape), shape_str(strides), offset,
                            storage_ ? storage_->nbytes() : 0);
  };
  if (storage_ == nullptr) fail("the storage is null");
  check_dtype(dtype_, "Tensor");
  if (shape.size() != strides.size()) {
    fail(fmt::format("{} strides for {} dims", strides.size(), shape.size()));
  }
  if (offset_ < 0) fail(fmt::format("offset {} is negative", offset_));
  const int64_t numel = checked_numel(shape, "Tensor");
  if (numel > 0) {
    // The lowest and highest element offsets the view reaches, in checked arithmetic.
    int64_t lo = offset_;
    int64_t hi = offset_;
    bool overflow = false;
    for (std::size_t d = 0; d < shape.size() && !overflow; ++d) {
      int64_t span = 0;
      overflow = __builtin_mul_overflow(shape[d] - 1, strides[d], &span) ||
                 __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi);
    }
    int64_t end_bytes = 0;
    overflow = overflow || __builtin_add_overflow(hi, 1, &hi) ||
               __builtin_mul_overflow(hi, static_cast<int64_t>(spmd::itemsize(dtype_)), &end_bytes);
    if (overflow || static_cast<std::size_t>(end_bytes) > storage_->nbytes()) {
      fail("the view reaches past the end of the storage");
    }
    if (lo < 0) fail("the view reaches before the start of the storage");
  }
  meta_ = std::make_shared<const Meta>(Meta{std::move(shape), std::move(strides), numel});
}

void Tensor::undefined_error(const char* op) {
  throw_error<Error>("Tensor::{}: the tensor is undefined (default-constructed)", op);
}

Tensor Tensor::as_view(Shape shape, Strides strides, int64_t offset) const {
  return Tensor(storage_, std::move(shape), std::move(strides), offset, dtype_);
}

Tensor Tensor::tracked(TensorMethod method, std::initializer_list<int64_t> ints,
                       Tensor result) const {
  if (autograd_ == nullptr) return result;
  return detail::record_method(method, *this, std::span<const int64_t>(ints.begin(), ints.size()),
                               result);
}

void Tensor::check_in_place(const char* op) const {
  if (autograd_ != nullptr && grad_enabled() && (autograd_->requires_grad || autograd_->grad_fn)) {
    throw_error<Unsupported>(
        "{}: an in-place write to a tensor that takes part in autograd (shape {}): autograd "
        "records no in-place ops; write a new tensor, or do it under NoGradGuard (as an "
        "optimizer update does)",
        op, shape_str(meta_->shape));
  }
  storage_->bump_version();
}

// ---- autograd -------------------------------------------------------------------------------

Tensor& Tensor::requires_grad_(bool requires_grad) {
  check_defined("requires_grad_");
  if (requires_grad && !is_floating(dtype_)) {
    throw_error<Unsupported>(
        "requires_grad_: only floating tensors can require gradients, this one is {} (shape {})",
        dtype_, shape_str(meta_->shape));
  }
  if (autograd_ != nullptr && autograd_->grad_fn != nullptr) {
    throw_error<Error>(
        "requires_grad_: this tensor (shape {}) was made by recorded ops, so its gradient flows "
        "to their inputs; only leaves can be marked (call detach() for a new leaf)",
        shape_str(meta_->shape));
  }
  if (autograd_ == nullptr) {
    if (!requires_grad) return *this;
    autograd_ = std::make_shared<AutogradMeta>();
  }
  autograd_->requires_grad = requires_grad;
  return *this;
}

bool Tensor::requires_grad() const {
  return autograd_ != nullptr && (autograd_->requires_grad || autograd_->grad_fn != nullptr);
}

Tensor Tensor::grad() const {
  return autograd_ != nullptr ? autograd_->grad : Tensor();
}

Tensor Tensor::detach() const {
  Tensor out = *this;
  out.autograd_ = nullptr;
  return out;
}

// ---- metadata -------------------------------------------------------------------------------

int64_t Tensor::size(int64_t d) const {
  check_defined("size");
  return meta_
      ->shape[static_cast<std::size_t>(normalize_dim(d, dim(), "Tensor::size", meta_->shape))];
}

int64_t Tensor::stride(int64_t d) const {
  check_defined("stride");
  return meta_
      ->strides[static_cast<std::size_t>(normalize_dim(d, dim(), "Tensor::stride", meta_->shape))];
}

Device Tensor::device() const {
  check_defined("device");
  return storage_->device();
}

bool Tensor::is_contiguous() const {
  check_defined("is_contiguous");
  if (meta_->numel == 0) return true;
  int64_t expected = 1;
  for (std::size_t d = meta_->shape.size(); d-- > 0;) {
    if (meta_->shape[d] == 1) continue;
    if (meta_->strides[d] != expected) return false;
    expected *= meta_->shape[d];
  }
  return true;
}

bool Tensor::is_same(const Tensor& other) const {
  return storage_ == other.storage_ && offset_ == other.offset_ && dtype_ == other.dtype_ &&
         (meta_ == other.meta_ ||
          (meta_->shape == other.meta_->shape && meta_->strides == other.meta_->strides));
}

void* Tensor::data_ptr() const {
  check_defined("data_ptr");
  if (is_meta()) throw_shape_only("Tensor::data_ptr", *this);
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(itemsize());
}

// ---- views ----------------------------------------------------------------------------------

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  check_defined("narrow");
  const auto ud = static_cast<std::size_t>(normalize_dim(d, dim(), "narrow", meta_->shape));
  const int64_t size = meta_->shape[ud];
  if (start < 0 || length < 0 || start > size - length) {
    throw_error<ShapeError>(
        "narrow: start {} and length {} are out of bounds for dim {} of size {} (shape {})", start,
        length, d, size, shape_str(meta_->shape));
  }
  Shape shape = meta_->shape;
  shape[ud] = length;
  return tracked(TensorMethod::Narrow, {static_cast<int64_t>(ud), start, length},
                 as_view(std::move(shape), meta_->strides,
                         length == 0 ? offset_ : offset_ + start * meta_->strides[ud]));
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  check_defined("select");
  const auto ud = static_cast<std::size_t>(normalize_dim(d, dim(), "select", meta_->shape));
  const int64_t size = meta_->shape[ud];
  if (index < -size || index >= size) {
    throw_error<ShapeError>("select: index {} is out of range for dim {} of size {} (shape {})",
                            index, d, size, shape_str(meta_->shape));
  }
  if (index < 0) index += size;
  Shape shape = meta_->shape;
  Strides strides = meta_->strides;
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(ud));
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(ud));
  return tracked(
      TensorMethod::Select, {static_cast<int64_t>(ud), index},
      as_view(std::move(shape), std::move(strides), offset_ + index * meta_->strides[ud]));
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  check_defined("chunk");
  d = normalize_dim(d, dim(), "chunk", meta_->shape);
  const int64_t size = meta_->shape[static_cast<std::size_t>(d)];
  const auto ranges = chunk_ranges(
      size, chunks, fmt::format("dim {} of size {} (shape {})", d, size, shape_str(meta_->shape)));
  std::vector<Tensor> pieces;
  try {
    pieces.reserve(ranges.size());
    for (const auto& [start, length] : ranges) pieces.push_back(narrow(d, start, length));
  } catch (const std::bad_alloc&) {
    // Up to kMaxChunks handles (and a shape each) may still not fit in what memory is left.
    throw_error<OutOfMemoryError>("chunk: no memory for {} pieces of dim {} of size {} (shape {})",
                                  ranges.size(), d, size, shape_str(meta_->shape));
  }
  return pieces;
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t d) const {
  check_defined("split");
  d = normalize_dim(d, dim(), "split", meta_->shape);
  const int64_t size = meta_->shape[static_cast<std::size_t>(d)];
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0 || total > size - s) {
      throw_error<ShapeError>("split: sizes {} do not add up to size {} of dim {} (shape {})",
                              shape_str(sizes), size, d, shape_str(meta_->shape));
    }
    total += s;
  }
  if (total != size) {
    throw_error<ShapeError>("split: sizes {} add up to {}, not to size {} of dim {} (shape {})",
                            shape_str(sizes), total, size, d, shape_str(meta_->shape));
  }
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow(d, start, s));
    start += s;
  }
  return pieces;
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  check_defined("transpose");
  const int64_t ndim = std::max<int64_t>(dim(), 1);  // a 0-d tensor transposes dim 0 with itself
  a = normalize_dim(a, ndim, "transpose", meta_->shape);
  b = normalize_dim(b, ndim, "transpose", meta_->shape);
  if (dim() == 0) return *this;
  Shape shape = meta_->shape;
  Strides strides = meta_->strides;
  std::swap(shape[static_cast<std::size_t>(a)], shape[static_cast<std::size_t>(b)]);
  std::swap(strides[static_cast<std::size_t>(a)], strides[static_cast<std::size_t>(b)]);
  return tracked(TensorMethod::Transpose, {a, b},
                 as_view(std::move(shape), std::move(strides), offset_));
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  check_defined("permute");
  const std::size_t n = meta_->shape.size();
  std::vector<bool> seen(n, false);
  bool ok = dims.size() == n;
  Shape shape(n);
  Strides strides(n);
  for (std::size_t i = 0; ok && i < n; ++i) {
    const int64_t d = dims[i] < 0 ? dims[i] + dim() : dims[i];
    ok = d >= 0 && d < dim() && !seen[static_cast<std::size_t>(d)];
    if (!ok) break;
    seen[static_cast<std::size_t>(d)] = true;
    shape[i] = meta_->shape[static_cast<std::size_t>(d)];
    strides[i] = meta_->strides[static_cast<std::size_t>(d)];
  }
  if (!ok) {
    throw_error<ShapeError>("permute: dims {} are not a permutation of the {} dims of shape {}",
                            shape_str(dims), n, shape_str(meta_->shape));
  }
  Tensor result = as_view(std::move(shape), std::move(strides), offset_);
  if (autograd_ == nullptr) return result;
  return detail::record_method(TensorMethod::Permute, *this, dims, result);
}

Tensor Tensor::reshape(const Shape& shape) const {
  check_defined("reshape");
  Shape target = infer_shape("reshape", shape, meta_->numel, meta_->shape);
  Tensor result;
  if (std::optional<Strides> strides = view_strides(meta_->shape, meta_->strides, target)) {
    result = as_view(target, std::move(*strides), offset_);
  } else {
    Tensor copy = empty_for("reshape", meta_->shape, dtype_, device());
    copy.copy_(*this);
    result = copy.as_view(target, contiguous_strides(target), copy.offset_);
  }
  if (autograd_ == nullptr) return result;
  return detail::record_method(TensorMethod::Reshape, *this, target, result);
}

Tensor Tensor::view(const Shape& shape) const {
  check_defined("view");
  Shape target = infer_shape("view", shape, meta_->numel, meta_->shape);
  std::optional<Strides> strides = view_strides(meta_->shape, meta_->strides, target);
  if (!strides) {
    throw_error<ShapeError>(
        "view: shape {} is not compatible with the input's shape {} and strides {} (use "
        "reshape, which copies)",
        shape_str(target), shape_str(meta_->shape), shape_str(meta_->strides));
  }
  Tensor result = as_view(target, std::move(*strides), offset_);
  if (autograd_ == nullptr) return result;
  return detail::record_method(TensorMethod::Reshape, *this, target, result);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  check_defined("unsqueeze");
  const auto ud = static_cast<std::size_t>(normalize_dim(d, dim() + 1, "unsqueeze", meta_->shape));
  Shape shape = meta_->shape;
  Strides strides = meta_->strides;
  const int64_t stride = ud < meta_->shape.size() ? meta_->shape[ud] * meta_->strides[ud] : 1;
  shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(ud), 1);
  strides.insert(strides.begin() + static_cast<std::ptrdiff_t>(ud), stride);
  return tracked(TensorMethod::Unsqueeze, {static_cast<int64_t>(ud)},
                 as_view(std::move(shape), std::move(strides), offset_));
}

Tensor Tensor::squeeze(int64_t d) const {
  check_defined("squeeze");
  const auto ud = static_cast<std::size_t>(
      normalize_dim(d, std::max<int64_t>(dim(), 1), "squeeze", meta_->shape));
  if (dim() == 0 || meta_->shape[ud] != 1) return *this;
  Shape shape = meta_->shape;
  Strides strides = meta_->strides;
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(ud));
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(ud));
  return tracked(TensorMethod::Squeeze, {static_cast<int64_t>(ud)},
                 as_view(std::move(shape), std::move(strides), offset_));
}

Tensor Tensor::expand(const Shape& shape) const {
  check_defined("expand");
  if (shape.size() < meta_->shape.size()) {
    throw_error<ShapeError>("expand: target shape {} has fewer dims than the input's shape {}",
                            shape_str(shape), shape_str(meta_->shape));
  }
  const std::size_t lead = shape.size() - meta_->shape.size();
  Shape out(shape.size());
  Strides strides(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const int64_t want = shape[i];
    if (i < lead) {
      if (want < 0) {
        throw_error<ShapeError>("expand: size {} is invalid for new leading dim {} of shape {}",
                                want, i, shape_str(shape));
      }
      out[i] = want;
      strides[i] = 0;
      continue;
    }
    const int64_t have = meta_->shape[i - lead];
    if (want == -1 || want == have) {
      out[i] = have;
      strides[i] = meta_->strides[i - lead];
    } else if (have == 1 && want >= 0) {
      out[i] = want;
      strides[i] = 0;
    } else {
      throw_error<ShapeError>("expand: cannot expand shape {} to {} (dim {}: size {} to {})",
                              shape_str(meta_->shape), shape_str(shape), i, have, want);
    }
  }
  checked_numel(out, "expand");
  Tensor result = as_view(out, std::move(strides), offset_);
  if (autograd_ == nullptr) return result;
  return detail::record_method(TensorMethod::Expand, *this, out, result);
}

// ---- copies ---------------------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  check_defined("contiguous");
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  check_defined("clone");
  Tensor out = empty_for("clone", meta_->shape, dtype_, device());
  out.copy_(*this);
  return tracked(TensorMethod::Clone, {}, std::move(out));
}

Tensor Tensor::to(DType dtype) const {
  check_defined("to");
  check_dtype(dtype, "to");
  if (dtype == dtype_) return *this;
  check_integral_values("to", dtype);
  return tracked(TensorMethod::Cast, {static_cast<int64_t>(dtype)}, converted(dtype));
}

Tensor Tensor::converted(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty_for("to", meta_->shape, dtype, device());
  out.copy_unchecked(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  check_defined("to");
  // A shape-only tensor stays one: it has no values to move.
  if (device == this->device() || is_meta()) return *this;
  if (grad_enabled() && requires_grad()) {
    throw_error<Unsupported>(
        "Tensor::to: moving a tensor that takes part in autograd ({} {}) to {} is not "
        "differentiable; move it before requires_grad_() or under NoGradGuard",
        shape_str(meta_->shape), dtype_, device);
  }
  Tensor out = empty_for("to", meta_->shape, dtype_, device);
  out.copy_(*this);
  return out;
}

// Note [Conversions to integers]
// Converting a value an integer dtype cannot hold (NaN, an infinity, or a number outside its
// range: a float, or an I64 narrowed to I32) is an Unsupported error naming the op, the first
// such element (flat and multi-dim index) and its value, whether the conversion is to(),
// copy_(), item() or to_vector(). torch leaves these undefined (NaN becomes INT_MIN on x86, an
// I64 wraps); a silent 0 or a wrapped number would pass unnoticed into indices and counts.
// Fractions truncate toward zero, as in a cast. Bool and floating destinations take any value.
bool Tensor::needs_value_check(DType from, DType to) {
  return (to == DType::I32 && (is_floating(from) || from == DType::I64)) ||
         (to == DType::I64 && is_floating(from));
}

void Tensor::check_integral_values(const char* op, DType to) const {
  if (!needs_value_check(dtype_, to) || meta_->numel == 0 || is_meta()) return;
  const Tensor host = this->detach().to(cpu());
  const double limit = to == DType::I64 ? 0x1p63 : 0x1p31;
  const Shape& shape = host.meta_->shape;
  const Strides& strides = host.meta_->strides;
  const int64_t bad = dispatch_dtype(dtype_, [&]<class S>() -> int64_t {
    const S* base = host.data<S>();
    auto holds = [&](S element) {
      const double v = convert_element<double>(element);
      // As check_fill_value: i64 also takes 2^63, the double INT64_MAX rounds to.
      return v >= -limit && (v < limit || (to == DType::I64 && v == limit));
    };
    if (host.is_contiguous()) {
      for (int64_t i = 0; i < meta_->numel; ++i) {
        if (!holds(base[i])) return i;
      }
      return -1;
    }
    // Row-major over a strided view, without materializing it (it may be an expanded view).
    std::vector<int64_t> index(shape.size(), 0);
    int64_t offset = 0;
    for (int64_t i = 0; i < meta_->numel; ++i) {
      if (!holds(base[offset])) return i;
      for (size_t d = shape.size(); d-- > 0;) {
        offset += strides[d];
        if (++index[d] < shape[d]) break;
        offset -= strides[d] * shape[d];
        index[d] = 0;
      }
    }
    return -1;
  });
  if (bad < 0) return;
  const std::vector<int64_t> index = unravel_index(bad, shape);
  int64_t offset = 0;
  for (size_t d = 0; d < index.size(); ++d) offset += index[d] * strides[d];
  const double value = dispatch_dtype(
      dtype_, [&]<class S>() { return convert_element<double>(host.data<S>()[offset]); });
  throw_error<Unsupported>(
      "{}: element {} (index {}) is {}, which {} cannot hold (tensor shape {} {}; Note "
      "[Conversions to integers])",
      op, bad, shape_str(index), value, to, shape_str(shape), dtype_);
}

template <class T>
T Tensor::item() const {
  check_defined("item");
  if (meta_->numel != 1) {
    throw_error<ShapeError>("item: a tensor of shape {} has {} elements, not 1",
                            shape_str(meta_->shape), meta_->numel);
  }
  if (is_meta()) throw_shape_only("item", *this);
  check_integral_values("item", dtype_of<T>());
  if (!device().is_cpu()) return to(cpu()).item<T>();
  return dispatch_dtype(dtype_, [&]<class S>() { return convert_element<T>(*data<S>()); });
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  check_defined("to_vector");
  if (is_meta()) throw_shape_only("to_vector", *this);
  check_integral_values("to_vector", dtype_of<T>());
  const Tensor host = to(cpu()).converted(dtype_of<T>()).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + meta_->numel);
}

#define SPMD_INSTANTIATE_ELEMENT_ACCESS(T) \
  template T Tensor::item<T>() const;      \
  template std::vector<T> Tensor::to_vector<T>() const;
SPMD_INSTANTIATE_ELEMENT_ACCESS(float)
SPMD_INSTANTIATE_ELEMENT_ACCESS(double)
SPMD_INSTANTIATE_ELEMENT_ACCESS(BFloat16)
SPMD_INSTANTIATE_ELEMENT_ACCESS(Half)
SPMD_INSTANTIATE_ELEMENT_ACCESS(int32_t)
SPMD_INSTANTIATE_ELEMENT_ACCESS(int64_t)
SPMD_INSTANTIATE_ELEMENT_ACCESS(bool)
#undef SPMD_INSTANTIATE_ELEMENT_ACCESS

// ---- in place -------------------------------------------------------------------------------

Tensor& Tensor::fill_(double value) {
  check_defined("fill_");
  if (is_meta()) {
    check_in_place("fill_");
    return *this;
  }
  DeviceOps& kernels = kernels_for("fill_", {this});
  check_fill_value(value, dtype_, "fill_");
  check_in_place("fill_");
  if (has_broadcast_dim(meta_->shape, meta_->strides)) {
    throw_error<ShapeError>(
        "fill_: the destination (shape {}, strides {}) is an expanded view whose elements share "
        "memory",
        shape_str(meta_->shape), shape_str(meta_->strides));
  }
  kernels.fill(*this, value);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_defined("copy_");
  if (src.defined()) src.check_integral_values("copy_", dtype());
  return copy_unchecked(src);
}

Tensor& Tensor::copy_unchecked(const Tensor& src) {
  check_defined("copy_");
  if (!src.defined()) throw_error<Error>("copy_: the source is an undefined tensor");
  check_in_place("copy_");
  if (broadcast_shapes(src.meta_->shape, meta_->shape, "copy_") != meta_->shape) {
    throw_error<ShapeError>("copy_: source shape {} does not broadcast to destination shape {}",
                            shape_str(src.meta_->shape), shape_str(meta_->shape));
  }
  if (has_broadcast_dim(meta_->shape, meta_->strides)) {
    throw_error<ShapeError>(
        "copy_: the destination (shape {}, strides {}) is an expanded view whose elements share "
        "memory",
        shape_str(meta_->shape), shape_str(meta_->strides));
  }
  if (meta_->numel == 0) return *this;
  if (is_meta()) return *this;
  if (src.is_meta()) throw_shape_only("copy_ (the source)", src);
  Tensor source = src.expand(meta_->shape);
  if (source.is_same(*this)) return *this;
  if (src.storage_ == storage_) {
    // Reading and writing one buffer: copy the source aside first if the two may overlap.
    const Extent a = extent_of(meta_->shape, meta_->strides, offset_);
    const Extent b = extent_of(src.meta_->shape, src.meta_->strides, src.offset_);
    const std::size_t sa = itemsize();
    const std::size_t sb = src.itemsize();
    if (static_cast<std::size_t>(a.lo) * sa < static_cast<std::size_t>(b.hi) * sb &&
        static_cast<std::size_t>(b.lo) * sb < static_cast<std::size_t>(a.hi) * sa) {
      source = src.clone().expand(meta_->shape);
    }
  }
  // Host <-> device copies run on the device's kernels.
  const Device device = storage_->device().is_cpu() ? source.device() : storage_->device();
  kernels_for("copy_", device).copy(*this, source);
  return *this;
}

// ---- printing -------------------------------------------------------------------------------

namespace {

// Note [Tensor printing]
// Like torch: large tensors (more than kSummarizeAbove elements) show the first and last
// kEdgeItems indices of every dim with "..." between; floats share one format chosen from the
// shown values (integral values as "3.", fixed with 4 decimals, or scientific when magnitudes
// span more than 1e3 or leave [1e-4, 1e8)); all entries are right-aligned to one width.
constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;
constexpr std::size_t kLineWidth = 80;

std::vector<std::string> format_floats(const std::vector<double>& values) {
  bool integral = true;
  double max_abs = 0;
  double min_abs = INFINITY;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    integral = integral && v == std::nearbyint(v);
    const double a = std::abs(v);
    max_abs = std::max(max_abs, a);
    if (a != 0) min_abs = std::min(min_abs, a);
  }
  if (min_abs == INFINITY) min_abs = max_abs;
  const bool wide_range = min_abs > 0 && max_abs / min_abs > 1e3;
  const bool scientific =
      max_abs >= 1e8 || wide_range || (!integral && min_abs > 0 && min_abs < 1e-4);
  std::vector<std::string> out;
  out.reserve(values.size());
  for (double v : values) {
    if (std::isnan(v)) {
      out.push_back("nan");
    } else if (std::isinf(v)) {
      out.push_back(v > 0 ? "inf" : "-inf");
    } else if (scientific) {
      out.push_back(fmt::format("{:.4e}", v));
    } else if (integral) {
      out.push_back(fmt::format("{:.0f}.", v));
    } else {
      out.push_back(fmt::format("{:.4f}", v));
    }
  }
  return out;
}

class Printer {
 public:
  Printer(const Tensor& t, std::size_t indent) : t_(t), indent_(indent) {
    const bool summarize = t.numel() > kSummarizeAbove;
    for (int64_t s : t.shape()) {
      std::vector<int64_t> shown;
      for (int64_t i = 0; i < s; ++i) {
        if (summarize && s > 2 * kEdgeItems && i == kEdgeItems) {
          shown.push_back(-1);  // the ellipsis
          i = s - kEdgeItems;
        }
        shown.push_back(i);
      }
      shown_.push_back(std::move(shown));
    }
    std::vector<int64_t> offsets;
    gather_offsets(0, t.storage_offset(), offsets);
    dispatch_dtype(t.dtype(), [&]<class T>() {
      const T* base = static_cast<const T*>(t.storage()->data());
      if constexpr (std::is_same_v<T, bool>) {
        for (int64_t o : offsets) entries_.push_back(base[o] ? "True" : "False");
      } else if constexpr (std::is_integral_v<T>) {
        for (int64_t o : offsets) entries_.push_back(fmt::format("{}", base[o]));
      } else {
        std::vector<double> values;
        for (int64_t o : offsets) values.push_back(convert_element<double>(base[o]));
        entries_ = format_floats(values);
      }
    });
    for (const std::string& e : entries_) width_ = std::max(width_, e.size());
  }

  std::string body() const {
    std::string out;
    std::size_t next = 0;
    emit(out, 0, next);
    return out;
  }

 private:
  // Storage offsets of the shown elements, in row-major order.
  void gather_offsets(std::size_t d, int64_t offset, std::vector<int64_t>& offsets) const {
    if (d == shown_.size()) {
      offsets.push_back(offset);
      return;
    }
    for (int64_t i : shown_[d]) {
      if (i >= 0) gather_offsets(d + 1, offset + i * t_.strides()[d], offsets);
    }
  }

  void emit(std::string& out, std::size_t d, std::size_t& next) const {
    const std::size_t ndim = shown_.size();
    if (d == ndim) {
      out.append(width_ - entries_[next].size(), ' ');
      out += entries_[next++];
      return;
    }
    out += '[';
    const std::size_t column = indent_ + d + 1;
    const std::size_t per_line =
        std::max<std::size_t>(1, (kLineWidth - std::min(kLineWidth, column)) / (width_ + 2));
    const std::vector<int64_t>& shown = shown_[d];
    for (std::size_t k = 0; k < shown.size(); ++k) {
      if (k > 0) {
        if (d + 1 < ndim) {
          out += ',';
          out.append(ndim - d - 1, '\n');
          out.append(column, ' ');
        } else if (k % per_line == 0) {
          out += ",\n";
          out.append(column, ' ');
        } else {
          out += ", ";
        }
      }
      if (shown[k] < 0) {
        out += "...";
      } else {
        emit(out, d + 1, next);
      }
    }
    out += ']';
  }

  const Tensor& t_;
  std::size_t indent_;
  std::vector<std::vector<int64_t>> shown_;
  std::vector<std::string> entries_;
  std::size_t width_ = 0;
};

}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "tensor(undefined)";
  if (is_meta()) {
    return fmt::format("tensor(..., shape={}, dtype={}, device=meta)", shape_str(meta_->shape),
                       dtype_);
  }
  const std::string prefix = "tensor(";
  // No elements: nothing to lay out (a dim of size 2^40 beside a 0 would list 2^40 indices).
  std::string out =
      prefix + (meta_->numel == 0 ? std::string("[]") : Printer(to(cpu()), prefix.size()).body());
  out += fmt::format(", shape={}, dtype={}", shape_str(meta_->shape), dtype_);
  if (!device().is_cpu()) out += fmt::format(", device={}", device());
  out += ')';
  return out;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.to_string();
}

}  // namespace spmd
