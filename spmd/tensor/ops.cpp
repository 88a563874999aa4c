// spmd/tensor/ops.cpp: the front ends of every op in tensor/ops.h.
//
// Each op checks its inputs, works out the result's shape and dtype (Note [Type promotion]),
// allocates the result, broadcasts and converts the inputs, and hands the arithmetic to the
// DeviceOps of the inputs' device, looked up once per op with kernels_for (tensor/device_ops.h).
#include <spmd/tensor/ops.h>

#include <cmath>
#include <type_traits>

#include <spmd/core/check.h>
#include <spmd/tensor/device_ops.h>

namespace spmd {
namespace {

bool is_integral_value(double v) {
  return std::isfinite(v) && v == std::trunc(v);
}

// t converted to `dtype` and broadcast to `shape`; t itself (no new handle) when it already is.
Tensor as_operand(const Tensor& t, DType dtype, const Shape& shape) {
  if (t.dtype() == dtype && t.shape() == shape) return t;
  return t.to(dtype).expand(shape);
}

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  const std::string_view name = op_name(op);
  DeviceOps& kernels = kernels_for(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  checked_numel(shape, name);
  DType dtype = promote_types(a.dtype(), b.dtype());
  if (op == BinaryOp::Div && !is_floating(dtype)) dtype = DType::F32;  // true division
  const bool arithmetic = op == BinaryOp::Add || op == BinaryOp::Sub || op == BinaryOp::Mul;
  if (arithmetic && dtype == DType::Bool) {
    throw_error<Unsupported>("{}: arithmetic on bool is not supported (shapes {} and {})", name,
                             shape_str(a.shape()), shape_str(b.shape()));
  }
  Tensor out = empty(shape, dtype, a.device());
  kernels.binary(op, out, as_operand(a, dtype, shape), as_operand(b, dtype, shape));
  return out;
}

// A tensor op a Python-style scalar (see Note [Type promotion]); `scalar_first` for scalar op t.
Tensor scalar_op(BinaryOp op, const Tensor& t, double value, bool scalar_first) {
  kernels_for(op_name(op), {&t});
  DType dtype = t.dtype();
  // True division, or a non-integral scalar, makes an integer or Bool tensor compute in F32
  // (without this, Bool would turn the scalar into true/false).
  if (!is_floating(dtype) && (op == BinaryOp::Div || !is_integral_value(value))) {
    dtype = DType::F32;
  }
  if (dtype == DType::BF16 || dtype == DType::F16) {
    // The scalar keeps F32 precision: compute in F32 and round the result once.
    return scalar_op(op, t.to(DType::F32), value, scalar_first).to(dtype);
  }
  const Tensor s = full({}, value, dtype, t.device());
  return scalar_first ? binary_op(op, s, t.to(dtype)) : binary_op(op, t.to(dtype), s);
}

bool floating_only(UnaryOp op) {
  return op != UnaryOp::Neg && op != UnaryOp::Abs && op != UnaryOp::Relu;
}

Tensor unary_op(UnaryOp op, const Tensor& t) {
  const std::string_view name = op_name(op);
  DeviceOps& kernels = kernels_for(name, {&t});
  DType dtype = t.dtype();
  if (floating_only(op)) {
    if (!is_floating(dtype)) dtype = DType::F32;
  } else if (dtype == DType::Bool) {
    throw_error<Unsupported>("{}: dtype bool is not supported (shape {})", name,
                             shape_str(t.shape()));
  }
  Tensor out = empty(t.shape(), dtype, t.device());
  kernels.unary(op, out, t.to(dtype));
  return out;
}

Tensor reduce_op(Reduction op, const Tensor& t, const std::vector<int64_t>& dims_in, bool keepdim) {
  const std::string_view name = op_name(op);
  DeviceOps& kernels = kernels_for(name, {&t});
  const int64_t ndim = t.dim();
  std::vector<bool> reduced(static_cast<std::size_t>(ndim), dims_in.empty());
  for (int64_t d : dims_in) {
    // A 0-d tensor accepts dim 0 / -1, as in torch; there is nothing to reduce over.
    const int64_t nd = normalize_dim(d, std::max<int64_t>(ndim, 1), name, t.shape());
    if (ndim == 0) continue;
    if (reduced[static_cast<std::size_t>(nd)]) {
      throw_error<ShapeError>("{}: dim {} appears more than once in dims {} (shape {})", name, d,
                              shape_str(dims_in), shape_str(t.shape()));
    }
    reduced[static_cast<std::size_t>(nd)] = true;
  }
  std::vector<int64_t> dims;
  Shape kept_shape = t.shape();
  Shape result_shape;
  int64_t count = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    const auto ud = static_cast<std::size_t>(d);
    if (reduced[ud]) {
      dims.push_back(d);
      count *= t.shape()[ud];
      kept_shape[ud] = 1;
      if (keepdim) result_shape.push_back(1);
    } else {
      result_shape.push_back(t.shape()[ud]);
    }
  }

  DType dtype = t.dtype();
  switch (op) {
    case Reduction::Sum:
      if (!is_floating(dtype)) dtype = DType::I64;
      break;
    case Reduction::Mean:
      if (!is_floating(dtype)) {
        throw_error<Unsupported>(
            "mean: dtype {} is not supported (shape {}); only floating dtypes have a mean, "
            "convert with to(DType::F32)",
            dtype, shape_str(t.shape()));
      }
      break;
    case Reduction::Amax:
    case Reduction::Amin:
      if (count == 0 && shape_numel(kept_shape) > 0) {
        throw_error<ShapeError>(
            "{}: cannot reduce over zero elements (dims {} of shape {}): there is no identity",
            name, shape_str(dims), shape_str(t.shape()));
      }
      break;
  }
  Tensor out = empty(kept_shape, dtype, t.device());
  kernels.reduce(op, out, t, dims);
  return out.view(result_shape);
}

DType matmul_dtype(std::string_view op, std::initializer_list<const Tensor*> tensors) {
  DType dtype = (*tensors.begin())->dtype();
  for (const Tensor* t : tensors) dtype = promote_types(dtype, t->dtype());
  if (dtype == DType::Bool) {
    throw_error<Unsupported>("{}: dtype bool is not supported", op);
  }
  return dtype;
}

// a2 and b2 are the matrices (or batches) a and b were made into; errors name a and b.
void check_inner_sizes(std::string_view op, const Tensor& a, const Tensor& b, const Tensor& a2,
                       const Tensor& b2) {
  if (a2.size(-1) != b2.size(-2)) {
    throw_error<ShapeError>(
        "{}: shapes {} and {} cannot be multiplied (inner sizes {} and {} differ)", op,
        shape_str(a.shape()), shape_str(b.shape()), a2.size(-1), b2.size(-2));
  }
}

Tensor softmax_op(const char* name, const Tensor& t, int64_t d, bool log) {
  DeviceOps& kernels = kernels_for(name, {&t});
  d = normalize_dim(d, std::max<int64_t>(t.dim(), 1), name, t.shape());
  const DType dtype = is_floating(t.dtype()) ? t.dtype() : DType::F32;
  if (t.dim() == 0) return softmax_op(name, t.unsqueeze(0), 0, log).view({});
  Tensor out = empty(t.shape(), dtype, t.device());
  kernels.softmax(out, t.to(dtype), d, log);
  return out;
}

}  // namespace

// ---- factories ------------------------------------------------------------------------------

Tensor empty(const Shape& shape, DType dtype, Device device) {
  const int64_t numel = checked_numel(shape, "empty");
  auto storage = Storage::allocate(static_cast<std::size_t>(numel) * itemsize(dtype), device);
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor out = empty(shape, dtype, device);
  out.fill_(value);
  return out;
}

Tensor arange(int64_t n, DType dtype) {
  if (n < 0) throw_error<ShapeError>("arange: n must be non-negative, got {}", n);
  if (dtype == DType::Bool) throw_error<Unsupported>("arange: dtype bool is not supported");
  Tensor out = empty({n}, dtype);
  dispatch_dtype(dtype, [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = convert_element<T>(i);
  });
  return out;
}

Tensor scalar_tensor(double value, DType dtype) {
  return full({}, value, dtype);
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  const Shape actual = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
  const int64_t numel = checked_numel(actual, "from_vector");
  if (static_cast<std::size_t>(numel) != values.size()) {
    throw_error<ShapeError>("from_vector: {} values do not fill shape {} ({} elements)",
                            values.size(), shape_str(actual), numel);
  }
  Tensor out = empty(actual, dtype_of<T>());
  std::copy(values.begin(), values.end(), out.data<T>());
  return out;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&);

// ---- elementwise ----------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Add, a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Sub, a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Mul, a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Div, a, b);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Maximum, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Minimum, a, b);
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator+(const Tensor& a, double b) {
  return scalar_op(BinaryOp::Add, a, b, false);
}
Tensor operator-(const Tensor& a, double b) {
  return scalar_op(BinaryOp::Sub, a, b, false);
}
Tensor operator*(const Tensor& a, double b) {
  return scalar_op(BinaryOp::Mul, a, b, false);
}
Tensor operator/(const Tensor& a, double b) {
  return scalar_op(BinaryOp::Div, a, b, false);
}
Tensor operator+(double a, const Tensor& b) {
  return scalar_op(BinaryOp::Add, b, a, true);
}
Tensor operator-(double a, const Tensor& b) {
  return scalar_op(BinaryOp::Sub, b, a, true);
}
Tensor operator*(double a, const Tensor& b) {
  return scalar_op(BinaryOp::Mul, b, a, true);
}
Tensor operator/(double a, const Tensor& b) {
  return scalar_op(BinaryOp::Div, b, a, true);
}
Tensor operator-(const Tensor& a) {
  return neg(a);
}

// ---- unary ----------------------------------------------------------------------------------

Tensor neg(const Tensor& t) {
  return unary_op(UnaryOp::Neg, t);
}
Tensor abs(const Tensor& t) {
  return unary_op(UnaryOp::Abs, t);
}
Tensor exp(const Tensor& t) {
  return unary_op(UnaryOp::Exp, t);
}
Tensor log(const Tensor& t) {
  return unary_op(UnaryOp::Log, t);
}
Tensor sqrt(const Tensor& t) {
  return unary_op(UnaryOp::Sqrt, t);
}
Tensor tanh(const Tensor& t) {
  return unary_op(UnaryOp::Tanh, t);
}
Tensor relu(const Tensor& t) {
  return unary_op(UnaryOp::Relu, t);
}
Tensor gelu(const Tensor& t) {
  return unary_op(UnaryOp::Gelu, t);
}

// ---- reductions -----------------------------------------------------------------------------

Tensor sum(const Tensor& t) {
  return reduce_op(Reduction::Sum, t, {}, false);
}
Tensor sum(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(Reduction::Sum, t, dims, keepdim);
}
Tensor mean(const Tensor& t) {
  return reduce_op(Reduction::Mean, t, {}, false);
}
Tensor mean(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(Reduction::Mean, t, dims, keepdim);
}
Tensor amax(const Tensor& t) {
  return reduce_op(Reduction::Amax, t, {}, false);
}
Tensor amax(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(Reduction::Amax, t, dims, keepdim);
}
Tensor amin(const Tensor& t) {
  return reduce_op(Reduction::Amin, t, {}, false);
}
Tensor amin(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(Reduction::Amin, t, dims, keepdim);
}

// ---- linear algebra -------------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b) {
  DeviceOps& kernels = kernels_for("matmul", {&a, &b});
  if (a.dim() == 0 || b.dim() == 0) {
    throw_error<ShapeError>("matmul: both operands need at least 1 dim, got shapes {} and {}",
                            shape_str(a.shape()), shape_str(b.shape()));
  }
  const DType dtype = matmul_dtype("matmul", {&a, &b});
  // torch.matmul: a 1-d operand becomes a row (a) or column (b) matrix, removed again after.
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  check_inner_sizes("matmul", a, b, a2, b2);
  const int64_t n = a2.size(-2);
  const int64_t k = a2.size(-1);
  const int64_t m = b2.size(-1);
  const Shape batch = broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                                       Shape(b2.shape().begin(), b2.shape().end() - 2), "matmul");
  const int64_t batch_numel = checked_numel(batch, "matmul");
  auto batched = [&](const Tensor& t, int64_t rows, int64_t cols) {
    Shape full = batch;
    full.push_back(rows);
    full.push_back(cols);
    return t.to(dtype).expand(full).reshape({batch_numel, rows, cols});
  };
  Tensor out = empty({batch_numel, n, m}, dtype, a.device());
  kernels.matmul(out, batched(a2, n, k), batched(b2, k, m), 1.0, 0.0);
  Shape result = batch;
  if (a.dim() > 1) result.push_back(n);
  if (b.dim() > 1) result.push_back(m);
  return out.view(result);
}

Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, double beta, double alpha) {
  DeviceOps& kernels = kernels_for("addmm", {&c, &a, &b});
  if (a.dim() != 2 || b.dim() != 2) {
    throw_error<ShapeError>("addmm: a and b must be 2-d, got shapes {} and {}",
                            shape_str(a.shape()), shape_str(b.shape()));
  }
  check_inner_sizes("addmm", a, b, a, b);
  const Shape shape{a.size(0), b.size(1)};
  if (broadcast_shapes(c.shape(), shape, "addmm") != shape) {
    throw_error<ShapeError>("addmm: c of shape {} does not broadcast to the product's shape {}",
                            shape_str(c.shape()), shape_str(shape));
  }
  const DType dtype = matmul_dtype("addmm", {&c, &a, &b});
  if (!is_floating(dtype) && (!is_integral_value(alpha) || !is_integral_value(beta))) {
    throw_error<Unsupported>("addmm: alpha {} and beta {} must be integers for dtype {}", alpha,
                             beta, dtype);
  }
  Tensor out = empty(shape, dtype, a.device());
  if (beta != 0) out.copy_(c);
  kernels.matmul(out.unsqueeze(0), a.to(dtype).unsqueeze(0), b.to(dtype).unsqueeze(0), alpha, beta);
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  DeviceOps& kernels = kernels_for("bmm", {&a, &b});
  if (a.dim() != 3 || b.dim() != 3 || a.size(0) != b.size(0)) {
    throw_error<ShapeError>(
        "bmm: expects a [B, n, k] and b [B, k, m] with one batch size, got shapes {} and {}",
        shape_str(a.shape()), shape_str(b.shape()));
  }
  check_inner_sizes("bmm", a, b, a, b);
  const DType dtype = matmul_dtype("bmm", {&a, &b});
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, dtype, a.device());
  kernels.matmul(out, a.to(dtype), b.to(dtype), 1.0, 0.0);
  return out;
}

// ---- softmax --------------------------------------------------------------------------------

Tensor softmax(const Tensor& t, int64_t d) {
  return softmax_op("softmax", t, d, false);
}

Tensor log_softmax(const Tensor& t, int64_t d) {
  return softmax_op("log_softmax", t, d, true);
}

// ---- joining and padding --------------------------------------------------------------------

Tensor cat(const std::vector<Tensor>& tensors, int64_t d) {
  if (tensors.empty()) throw_error<ShapeError>("cat: expects at least one tensor");
  const Tensor& first = tensors.front();
  DType dtype = first.dtype();
  for (const Tensor& t : tensors) {
    kernels_for("cat", {&first, &t});
    dtype = promote_types(dtype, t.dtype());
  }
  if (first.dim() == 0) {
    throw_error<ShapeError>("cat: 0-d tensors cannot be concatenated (tensor 0 has shape [])");
  }
  d = normalize_dim(d, first.dim(), "cat", first.shape());
  const auto ud = static_cast<std::size_t>(d);
  Shape shape = first.shape();
  shape[ud] = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Shape& s = tensors[i].shape();
    bool match = s.size() == shape.size();
    for (std::size_t j = 0; match && j < s.size(); ++j) match = j == ud || s[j] == shape[j];
    if (!match) {
      throw_error<ShapeError>(
          "cat: tensor {} has shape {} but tensor 0 has shape {} (sizes must match except along "
          "dim {})",
          i, shape_str(s), shape_str(first.shape()), d);
    }
    shape[ud] += s[ud];
  }
  Tensor out = empty(shape, dtype, first.device());
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    out.narrow(d, offset, t.size(d)).copy_(t);
    offset += t.size(d);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t d) {
  if (tensors.empty()) throw_error<ShapeError>("stack: expects at least one tensor");
  const Tensor& first = tensors.front();
  std::vector<Tensor> unsqueezed;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    kernels_for("stack", {&first, &tensors[i]});
    if (tensors[i].shape() != first.shape()) {
      throw_error<ShapeError>("stack: tensor {} has shape {} but tensor 0 has shape {}", i,
                              shape_str(tensors[i].shape()), shape_str(first.shape()));
    }
  }
  d = normalize_dim(d, first.dim() + 1, "stack", first.shape());
  for (const Tensor& t : tensors) unsqueezed.push_back(t.unsqueeze(d));
  return cat(unsqueezed, d);
}

Tensor pad(const Tensor& t, int64_t d, int64_t before, int64_t after, double value) {
  kernels_for("pad", {&t});
  d = normalize_dim(d, t.dim(), "pad", t.shape());
  const int64_t size = t.size(d);
  if (before < 0 || after < 0) {
    throw_error<ShapeError>("pad: before {} and after {} must be non-negative (dim {}, shape {})",
                            before, after, d, shape_str(t.shape()));
  }
  Shape shape = t.shape();
  shape[static_cast<std::size_t>(d)] = size + before + after;
  Tensor out = empty(shape, t.dtype(), t.device());
  out.narrow(d, 0, before).fill_(value);
  out.narrow(d, before + size, after).fill_(value);
  out.narrow(d, before, size).copy_(t);
  return out;
}

Tensor unpad(const Tensor& t, int64_t d, int64_t before, int64_t after) {
  kernels_for("unpad", {&t});
  d = normalize_dim(d, t.dim(), "unpad", t.shape());
  const int64_t size = t.size(d);
  if (before < 0 || after < 0 || before > size - after) {
    throw_error<ShapeError>(
        "unpad: cannot remove {} + {} elements from dim {} of size {} (shape {})", before, after, d,
        size, shape_str(t.shape()));
  }
  return t.narrow(d, before, size - before - after);
}

// ---- comparisons ----------------------------------------------------------------------------

bool equal(const Tensor& a, const Tensor& b) {
  DeviceOps& kernels = kernels_for("equal", {&a, &b});
  if (a.shape() != b.shape()) return false;
  const DType dtype = promote_types(a.dtype(), b.dtype());
  return kernels.equal(a.to(dtype), b.to(dtype));
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  DeviceOps& kernels = kernels_for("allclose", {&a, &b});
  if (a.shape() != b.shape()) return false;
  const DType dtype = promote_types(a.dtype(), b.dtype());
  return kernels.allclose(a.to(dtype), b.to(dtype), rtol, atol);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  DeviceOps& kernels = kernels_for("max_abs_diff", {&a, &b});
  if (a.shape() != b.shape()) {
    throw_error<ShapeError>("max_abs_diff: shapes {} and {} differ", shape_str(a.shape()),
                            shape_str(b.shape()));
  }
  const DType dtype = promote_types(a.dtype(), b.dtype());
  return kernels.max_abs_diff(a.to(dtype), b.to(dtype));
}

bool has_nonfinite(const Tensor& t) {
  return kernels_for("has_nonfinite", {&t}).has_nonfinite(t);
}

}  // namespace spmd
