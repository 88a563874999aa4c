// spmd/tensor/shape.h: shapes, strides and the dim arithmetic every op shares.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
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

// Maps d in [-ndim, ndim) to [0, ndim); otherwise throws ShapeError naming `op`, the dim and
// the shape. For ops that insert a dim (unsqueeze, stack) pass ndim + 1.
int64_t normalize_dim(int64_t d, int64_t ndim, std::string_view op, const Shape& shape = {});

// The broadcast of two shapes (numpy rules, aligned on the right); ShapeError naming `op` and
// both shapes when a pair of sizes is neither equal nor 1.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

}  // namespace spmd
