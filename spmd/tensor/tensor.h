// spmd/tensor/tensor.h: the dense, strided, torch-like Tensor handle.
//
// A Tensor is a view: shared Storage + shape + element strides + element offset + dtype.
// Copying a Tensor copies the handle, not the data (use clone()). Views (narrow, select, chunk,
// split, transpose, permute, expand, and reshape where strides allow) share storage with their
// source. Free functions in ops/ops.h do the arithmetic (the op table); tensor/factory.h makes
// tensors and tensor/random.h has the RNG.
//
//   Tensor a = arange(6).reshape({2, 3});      // [[0, 1, 2], [3, 4, 5]], f32
//   Tensor b = a.transpose(0, 1).contiguous(); // 3x2 copy
//   Tensor c = matmul(a, b) + 1.0;             // 2x2
//   fmt::print("{}\n", c);
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/format.h>

#include <spmd/core/error.h>
#include <spmd/tensor/dtype.h>
#include <spmd/tensor/shape.h>
#include <spmd/tensor/storage.h>

namespace spmd {

struct AutogradMeta;                // tensor/autograd_meta.h
enum class TensorMethod : uint8_t;  // tensor/autograd_meta.h

class Tensor {
 public:
  // An undefined tensor: defined() is false; everything but defined() and assignment throws.
  Tensor() = default;
  // A view of `storage`. ShapeError naming the shape, strides, offset and storage size when the
  // storage is null, the strides do not match the dims, a size or the offset is negative, the
  // element count overflows, or an element the view reaches lies outside the storage;
  // Unsupported for a DType that is not one.
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset,
         DType dtype);

  // ---- metadata (each an Error naming it on an undefined tensor) ----------------------------
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return defined_meta("shape").shape; }
  int64_t dim() const { return static_cast<int64_t>(defined_meta("dim").shape.size()); }
  int64_t numel() const { return defined_meta("numel").numel; }
  DType dtype() const {
    check_defined("dtype");
    return dtype_;
  }
  // Size of dim d; negative d counts from the end. ShapeError when out of range.
  int64_t size(int64_t d) const;
  const Strides& strides() const { return defined_meta("strides").strides; }
  int64_t stride(int64_t d) const;
  int64_t storage_offset() const {
    check_defined("storage_offset");
    return offset_;
  }
  Device device() const;
  // A shape-only tensor (Note [Shape-only tensors] in tensor/meta.h): no values to read.
  bool is_meta() const { return storage_ != nullptr && storage_->device().is_meta(); }
  std::size_t itemsize() const {
    check_defined("itemsize");
    return spmd::itemsize(dtype_);
  }
  std::size_t nbytes() const {
    return static_cast<std::size_t>(defined_meta("nbytes").numel) * spmd::itemsize(dtype_);
  }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Same storage, offset, shape, strides and dtype: the two handles are the same view.
  bool is_same(const Tensor& other) const;

  // Address of the first element (storage data + offset). Device memory for device tensors.
  void* data_ptr() const;
  // Typed address of the first element; Unsupported unless T is this tensor's element type.
  template <class T>
  T* data() const {
    if (dtype_of<T>() != dtype_) {
      throw_error<Unsupported>("Tensor::data: tensor has dtype {}, requested {}", dtype_,
                               dtype_of<T>());
    }
    return static_cast<T*>(data_ptr());
  }

  // ---- views (share storage) --------------------------------------------------------------
  // Elements [start, start + length) of dim d.
  Tensor narrow(int64_t d, int64_t start, int64_t length) const;
  // Index `index` of dim d, removing that dim.
  Tensor select(int64_t d, int64_t index) const;
  // torch.chunk: each chunk has ceil(size / chunks) elements along d, the last ones may be
  // shorter, and fewer than `chunks` chunks come back when the size runs out. A dim of size 0
  // gives `chunks` empty pieces. ShapeError for more than kMaxChunks pieces (chunk(INT64_MAX) of
  // an empty dim must not exhaust memory), OutOfMemoryError when the pieces' handles do not fit.
  std::vector<Tensor> chunk(int64_t chunks, int64_t d = 0) const;
  static constexpr int64_t kMaxChunks = spmd::kMaxChunks;
  // Consecutive pieces of the given sizes along d; the sizes must add up to size(d).
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t d = 0) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  // A view when the strides allow it, a contiguous copy otherwise; one size may be -1.
  Tensor reshape(const Shape& shape) const;
  // Like reshape but never copies: ShapeError when a view is impossible.
  Tensor view(const Shape& shape) const;
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(int64_t d) const;
  // A broadcasting view (stride 0 along expanded dims); sizes -1 keep the dim.
  Tensor expand(const Shape& shape) const;

  // ---- copies -----------------------------------------------------------------------------
  // This tensor if already contiguous, else a contiguous copy.
  Tensor contiguous() const;
  // A contiguous copy that shares nothing with this tensor.
  Tensor clone() const;
  // A copy converted to `dtype` (this tensor itself when the dtype already matches). Unsupported,
  // naming the element and its value, when `dtype` is an integer dtype that cannot hold an
  // element (NaN, an infinity, out of range: Note [Conversions to integers] in tensor.cpp).
  Tensor to(DType dtype) const;
  // A copy on `device` (this tensor itself when already there).
  Tensor to(Device device) const;
  // The single element of a tensor with numel() == 1, converted to T; ShapeError otherwise.
  // Unsupported, naming the value, when T is an integer type that cannot hold it (NaN, an
  // infinity or out of range), as to().
  template <class T>
  T item() const;
  // All elements in row-major order, converted to T; Unsupported naming the first element an
  // integer T cannot hold, as item().
  template <class T>
  std::vector<T> to_vector() const;

  // ---- in place ---------------------------------------------------------------------------
  // Unsupported when an integer dtype cannot hold `value` (check_fill_value: NaN into i32).
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  // Copies `src` (broadcast to this shape, converted to this dtype) into this view; Unsupported
  // for values this dtype cannot hold, as to().
  Tensor& copy_(const Tensor& src);

  // ---- autograd (Note [Autograd] in ops/autograd.h) -----------------------------------------
  // Makes this tensor a leaf whose gradient backward() accumulates (or stops that); floating
  // dtypes only. Error for a tensor made by recorded ops (use detach() first). Returns *this.
  Tensor& requires_grad_(bool requires_grad = true);
  // True for a leaf that requires grad and for a tensor recorded ops made from one.
  bool requires_grad() const;
  // The gradient backward() accumulated into this leaf; undefined when there is none.
  Tensor grad() const;
  // The same values and storage without autograd state: backward stops here.
  Tensor detach() const;
  // The autograd state the copies of this handle share (null when it never took part).
  const std::shared_ptr<AutogradMeta>& autograd() const { return autograd_; }
  void set_autograd(std::shared_ptr<AutogradMeta> meta) { autograd_ = std::move(meta); }

  // Multi-line text: values (truncated when large), shape and dtype.
  std::string to_string() const;

 private:
  // An Error naming `op` for an undefined tensor. Inline: the accessors above are on every op's
  // path.
  void check_defined(const char* op) const {
    if (!defined()) [[unlikely]]
      undefined_error(op);
  }
  [[noreturn]] static void undefined_error(const char* op);
  // Whether converting `from` to `to` can meet a value `to` cannot hold.
  static bool needs_value_check(DType from, DType to);
  // Unsupported naming `op` and the first element that the integer dtype `to` cannot hold (Note
  // [Conversions to integers] in tensor.cpp); nothing for conversions that always fit.
  void check_integral_values(const char* op, DType to) const;
  // to(dtype) and copy_(src) without that check (the caller made it) and without the tape.
  Tensor converted(DType dtype) const;
  Tensor& copy_unchecked(const Tensor& src);
  // Another view of this tensor's storage.
  Tensor as_view(Shape shape, Strides strides, int64_t offset) const;
  // `result` of `method` on this tensor, recorded on the tape when this tensor takes part in
  // autograd and grad mode is on.
  Tensor tracked(TensorMethod method, std::initializer_list<int64_t> ints, Tensor result) const;
  // An in-place write: Unsupported when this tensor takes part in autograd and grad mode is on;
  // counts the write on the storage's version.
  void check_in_place(const char* op) const;

  // Shape, strides and element count: immutable once built and shared by copies of the handle,
  // so copying a Tensor costs two reference counts, not two vector allocations. An undefined
  // tensor points at a static empty Meta (no control block).
  struct Meta {
    Shape shape;
    Strides strides;
    int64_t numel = 0;
  };
  const Meta& defined_meta(const char* op) const {
    check_defined(op);
    return *meta_;
  }
  static std::shared_ptr<const Meta> empty_meta();

  std::shared_ptr<Storage> storage_;
  std::shared_ptr<const Meta> meta_ = empty_meta();
  std::shared_ptr<AutogradMeta> autograd_;
  int64_t offset_ = 0;
  DType dtype_ = DType::F32;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace spmd

SPMD_FORMAT_AS_TEXT(spmd::Tensor, value.to_string())
