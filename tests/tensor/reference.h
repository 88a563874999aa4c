// tests/tensor/reference.h: naive reference helpers and seeded test data for the tensor tests.
//
// The references read tensors element by element through shape, strides and data_ptr and
// compute in double; they never call the ops under test. Test data are small multiples of 1/4
// (floats) or small integers, so sums and products are exact in every dtype and most results
// can be compared with ==; the op's one rounding is reproduced with round_to().
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <spmd/ops/ops.h>

namespace spmd::testing {

// Row-major multi-index of flat position `i` in `shape`.
std::vector<int64_t> unravel(int64_t i, const Shape& shape);
// Element at `index` of t (through its strides), as double. Bool gives 0 or 1.
double element(const Tensor& t, const std::vector<int64_t>& index);
// Every element of t in row-major order, as double.
std::vector<double> values(const Tensor& t);
// v rounded to the nearest value of `dtype` (through float for BF16/F16, as kernels do).
double round_to(DType dtype, double v);
// Numpy broadcast of two shapes, written independently of broadcast_shapes.
Shape broadcast(const Shape& a, const Shape& b);
// The index into a tensor of shape `from` that broadcasts to `index` of a larger shape.
std::vector<int64_t> broadcast_index(const std::vector<int64_t>& index, const Shape& from);

// Memory layouts an input may have for the same logical shape.
enum class Layout { Contiguous, Transposed, Permuted, Narrowed, Expanded };
inline constexpr Layout kAllLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Permuted,
                                         Layout::Narrowed, Layout::Expanded};
std::string layout_name(Layout layout);

// Seeded generator of shapes and tensors.
class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  int64_t uniform(int64_t lo, int64_t hi);  // inclusive
  // A shape of rank in [min_rank, max_rank], sizes 0..4 (0 rarely unless `zeros`).
  Shape shape(int min_rank, int max_rank, bool zeros = true);
  // Some dims of `shape` dropped from the front and some set to 1: broadcastable to it.
  Shape broadcastable_to(const Shape& shape);
  // A tensor of `shape` and `dtype` with the given memory layout (falls back to contiguous
  // where the layout needs more dims). Values: floats k/4 for k in [-16, 16] (positive: k in
  // [1, 32]), integers in [-16, 16] ([1, 32]), Bool 0/1.
  Tensor tensor(const Shape& shape, DType dtype, Layout layout, bool positive = false);
  Layout layout();

 private:
  std::mt19937_64 rng_;
};

// Checks got against want (row-major) with |got - want| <= atol + rtol * |want|; NaN matches
// NaN, infinities must match exactly. Reports the first bad index with `context`.
void expect_values(const Tensor& got, const std::vector<double>& want, double rtol, double atol,
                   const std::string& context);

// Tolerance of one rounding to `dtype` after a transcendental computed in float/double.
double transcendental_rtol(DType dtype);

}  // namespace spmd::testing
