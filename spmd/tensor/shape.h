// spmd/tensor/shape.h: shapes, strides and the dim arithmetic every op shares.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spmd {

// Sizes per dim, outermost first. A 0-d tensor (a scalar) has an empty shape.
using Shape = std::vector<int64_t>;
// Element (not byte) strides per dim.
using Strides = std::vector<int64_t>;

// Product of the sizes (1 for a 0-d shape).
int64_t shape_numel(const Shape& shape);
// shape_numel for a shape from user input: ShapeError naming `op` and the shape when a size is
// negative or the element count (or its byte size) does not fit in int64.
int64_t checked_numel(const Shape& shape, std::string_view op);
// Row-major strides of a contiguous tensor of this shape.
Strides contiguous_strides(const Shape& shape);
// "[2, 3]".
std::string shape_str(const Shape& shape);
// The row-major multi-index of element `flat` of `shape` (all zeros for an empty shape).
std::vector<int64_t> unravel_index(int64_t flat, const Shape& shape);

// The [start, length] ranges of torch.chunk(n) along a dim of `size`: ceil(size / n) elements each,
// the last ones shorter and fewer than n pieces when the size runs out; a dim of size 0 gives n
// empty pieces. ShapeError (naming `what`, e.g. "dim 1 of size 6 (shape [2, 6])") for n <= 0 or
// more than kMaxChunks pieces. Tensor::chunk and every other chunk use it.
constexpr int64_t kMaxChunks = int64_t{1} << 24;
std::vector<std::pair<int64_t, int64_t>> chunk_ranges(int64_t size, int64_t chunks,
                                                      std::string_view what = {});

// Maps d in [-ndim, ndim) to [0, ndim); otherwise throws ShapeError naming `op`, the dim and
// the shape. For ops that insert a dim (unsqueeze, stack) pass ndim + 1.
int64_t normalize_dim(int64_t d, int64_t ndim, std::string_view op, const Shape& shape = {});

// The broadcast of two shapes (numpy rules, aligned on the right); ShapeError naming `op` and
// both shapes when a pair of sizes is neither equal nor 1.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

}  // namespace spmd
