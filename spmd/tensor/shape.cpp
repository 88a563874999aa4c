// spmd/tensor/shape.cpp: shape arithmetic shared by every op.
#include <spmd/tensor/shape.h>

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include <spmd/core/error.h>

namespace spmd {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t checked_numel(const Shape& shape, std::string_view op) {
  // Leaves room for the largest itemsize (8 bytes) so nbytes cannot overflow either.
  constexpr int64_t kMaxNumel = std::numeric_limits<int64_t>::max() / 8;
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) throw_error<ShapeError>("{}: negative size {} in shape {}", op, s, shape_str(shape));
  }
  for (int64_t s : shape) {
    if (s == 0) return 0;
  }
  for (int64_t s : shape) {
    if (n > kMaxNumel / s) {
      throw_error<ShapeError>("{}: shape {} has too many elements", op, shape_str(shape));
    }
    n *= s;
  }
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

std::vector<int64_t> unravel_index(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return index;
}

std::vector<std::pair<int64_t, int64_t>> chunk_ranges(int64_t size, int64_t chunks,
                                                      std::string_view what) {
  const std::string where = what.empty() ? std::string() : fmt::format(" of {}", what);
  if (chunks <= 0) {
    throw_error<ShapeError>("chunk: the number of chunks must be positive, got {}{}", chunks,
                            where);
  }
  // ceil(size / chunks) without forming size + chunks - 1, which overflows for huge counts.
  const int64_t piece = size / chunks + (size % chunks != 0 ? 1 : 0);
  const int64_t count = size == 0 ? chunks : size / piece + (size % piece != 0 ? 1 : 0);
  if (count > kMaxChunks) {
    throw_error<ShapeError>("chunk: {} chunks{} would be {} pieces; at most {}", chunks, where,
                            count, kMaxChunks);
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(static_cast<size_t>(count));
  if (size == 0) {
    out.assign(static_cast<size_t>(chunks), {0, 0});
    return out;
  }
  for (int64_t start = 0; start < size; start += std::min(piece, size - start)) {
    out.emplace_back(start, std::min(piece, size - start));
  }
  return out;
}

std::string shape_str(const Shape& shape) {
  // Built by hand: fmt::join trips a false GCC 12 warning in fmt 9 (see tensor/dtype.h).
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t normalize_dim(int64_t d, int64_t ndim, std::string_view op, const Shape& shape) {
  if (d < -ndim || d >= ndim) {
    if (ndim == 0) {
      throw_error<ShapeError>("{}: dim {} is out of range for a 0-d tensor (shape {})", op, d,
                              shape_str(shape));
    }
    throw_error<ShapeError>("{}: dim {} is out of range [{}, {}) for shape {}", op, d, -ndim, ndim,
                            shape_str(shape));
  }
  return d < 0 ? d + ndim : d;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t sa = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t sb = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      throw_error<ShapeError>(
          "{}: shapes {} and {} do not broadcast (size {} vs {} at dim {} from the right)", op,
          shape_str(a), shape_str(b), sa, sb, -static_cast<int64_t>(i) - 1);
    }
    out[n - 1 - i] = sa == 1 ? sb : sa;
  }
  return out;
}

}  // namespace spmd
