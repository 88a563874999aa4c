// spmd/tensor/compare.h: whole-tensor comparisons: equal, allclose, max_abs_diff, has_nonfinite.
//
// Each answers one value for whole tensors (the elementwise comparisons that give a Bool tensor
// are ops, in ops/ops.h). Mixed dtypes promote by Note [Type promotion] first.
#pragma once

#include <spmd/tensor/tensor.h>

namespace spmd {

// Same shape and every element equal (after promotion). Different shapes give false.
bool equal(const Tensor& a, const Tensor& b);
// Same shape and |a - b| <= atol + rtol * |b| elementwise; NaNs compare unequal.
// Unsupported for a tolerance that is negative or NaN.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
// max |a - b| over elements (a and b must have one shape); 0 for empty tensors, NaN if any NaN.
double max_abs_diff(const Tensor& a, const Tensor& b);
// True when any element is NaN or +-Inf.
bool has_nonfinite(const Tensor& t);

}  // namespace spmd
