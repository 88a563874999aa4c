// tests/tensor/reference.cpp: the naive references and test data of reference.h.
#include "tests/tensor/reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace spmd::testing {

std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = i % shape[d];
    i /= shape[d];
  }
  return index;
}

double element(const Tensor& t, const std::vector<int64_t>& index) {
  int64_t offset = 0;
  for (std::size_t d = 0; d < index.size(); ++d) offset += index[d] * t.strides()[d];
  const char* base = static_cast<const char*>(t.data_ptr());
  switch (t.dtype()) {
    case DType::F32:
      return reinterpret_cast<const float*>(base)[offset];
    case DType::F64:
      return reinterpret_cast<const double*>(base)[offset];
    case DType::BF16:
      return static_cast<float>(reinterpret_cast<const BFloat16*>(base)[offset]);
    case DType::F16:
      return static_cast<float>(reinterpret_cast<const Half*>(base)[offset]);
    case DType::I32:
      return reinterpret_cast<const int32_t*>(base)[offset];
    case DType::I64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(base)[offset]);
    case DType::Bool:
      return reinterpret_cast<const bool*>(base)[offset] ? 1.0 : 0.0;
    case DType::F8E4M3FN:
      return static_cast<float>(reinterpret_cast<const Float8E4M3FN*>(base)[offset]);
    case DType::F8E5M2:
      return static_cast<float>(reinterpret_cast<const Float8E5M2*>(base)[offset]);
  }
  return NAN;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(element(t, unravel(i, t.shape())));
  return out;
}

double round_to(DType dtype, double v) {
  switch (dtype) {
    case DType::F32:
      return static_cast<float>(v);
    case DType::F64:
      return v;
    case DType::BF16:
      return static_cast<float>(BFloat16(static_cast<float>(v)));
    case DType::F16:
      return static_cast<float>(Half(static_cast<float>(v)));
    case DType::I32:
    case DType::I64:
      return std::trunc(v);
    case DType::Bool:
      return v != 0 ? 1.0 : 0.0;
    case DType::F8E4M3FN:
      return static_cast<float>(Float8E4M3FN(static_cast<float>(v)));
    case DType::F8E5M2:
      return static_cast<float>(Float8E5M2(static_cast<float>(v)));
  }
  return NAN;
}

Shape broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

std::vector<int64_t> broadcast_index(const std::vector<int64_t>& index, const Shape& from) {
  std::vector<int64_t> out(from.size());
  const std::size_t lead = index.size() - from.size();
  for (std::size_t d = 0; d < from.size(); ++d) out[d] = from[d] == 1 ? 0 : index[lead + d];
  return out;
}

std::string layout_name(Layout layout) {
  switch (layout) {
    case Layout::Contiguous:
      return "contiguous";
    case Layout::Transposed:
      return "transposed";
    case Layout::Permuted:
      return "permuted";
    case Layout::Narrowed:
      return "narrowed";
    case Layout::Expanded:
      return "expanded";
  }
  return "?";
}

int64_t Gen::uniform(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
}

Shape Gen::shape(int min_rank, int max_rank, bool zeros) {
  Shape s(static_cast<std::size_t>(uniform(min_rank, max_rank)));
  for (int64_t& v : s) v = zeros && uniform(0, 9) == 0 ? 0 : uniform(1, 4);
  return s;
}

Shape Gen::broadcastable_to(const Shape& shape) {
  const auto drop = static_cast<std::size_t>(uniform(0, static_cast<int64_t>(shape.size())));
  Shape s(shape.begin() + static_cast<std::ptrdiff_t>(drop), shape.end());
  for (int64_t& v : s) {
    if (uniform(0, 3) == 0) v = 1;
  }
  return s;
}

Layout Gen::layout() {
  return kAllLayouts[uniform(0, 4)];
}

namespace {

void write(Tensor& t, int64_t i, double v) {
  char* base = static_cast<char*>(t.data_ptr());
  switch (t.dtype()) {
    case DType::F32:
      reinterpret_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DType::F64:
      reinterpret_cast<double*>(base)[i] = v;
      break;
    case DType::BF16:
      reinterpret_cast<BFloat16*>(base)[i] = BFloat16(static_cast<float>(v));
      break;
    case DType::F16:
      reinterpret_cast<Half*>(base)[i] = Half(static_cast<float>(v));
      break;
    case DType::I32:
      reinterpret_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case DType::I64:
      reinterpret_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case DType::Bool:
      reinterpret_cast<bool*>(base)[i] = v != 0;
      break;
    case DType::F8E4M3FN:
      reinterpret_cast<Float8E4M3FN*>(base)[i] = Float8E4M3FN(static_cast<float>(v));
      break;
    case DType::F8E5M2:
      reinterpret_cast<Float8E5M2*>(base)[i] = Float8E5M2(static_cast<float>(v));
      break;
  }
}

}  // namespace

Tensor Gen::tensor(const Shape& shape, DType dtype, Layout layout, bool positive) {
  const std::size_t nd = shape.size();
  if ((layout == Layout::Transposed || layout == Layout::Permuted) && nd < 2) {
    layout = Layout::Contiguous;
  }
  if (layout == Layout::Narrowed && nd < 1) layout = Layout::Contiguous;
  Shape base_shape = shape;
  std::vector<int64_t> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  std::size_t narrow_dim = 0;
  switch (layout) {
    case Layout::Contiguous:
      break;
    case Layout::Transposed:
      std::swap(base_shape[nd - 1], base_shape[nd - 2]);
      break;
    case Layout::Permuted:
      std::shuffle(perm.begin(), perm.end(), rng_);
      for (std::size_t i = 0; i < nd; ++i) base_shape[static_cast<std::size_t>(perm[i])] = shape[i];
      break;
    case Layout::Narrowed:
      narrow_dim = static_cast<std::size_t>(uniform(0, static_cast<int64_t>(nd) - 1));
      base_shape[narrow_dim] += 3;
      break;
    case Layout::Expanded:
      for (int64_t& s : base_shape) {
        if (uniform(0, 1) == 0) s = 1;
      }
      break;
  }
  Tensor base = empty(base_shape, dtype);
  for (int64_t i = 0; i < base.numel(); ++i) {
    double v;
    if (dtype == DType::Bool) {
      v = static_cast<double>(uniform(0, 1));
    } else {
      v = positive ? static_cast<double>(uniform(1, 32)) : static_cast<double>(uniform(-16, 16));
      if (is_floating(dtype)) v /= 4;
    }
    write(base, i, v);
  }
  switch (layout) {
    case Layout::Contiguous:
      return base;
    case Layout::Transposed:
      return base.transpose(-1, -2);
    case Layout::Permuted:
      return base.permute(perm);
    case Layout::Narrowed:
      return base.narrow(static_cast<int64_t>(narrow_dim), 1, shape[narrow_dim]);
    case Layout::Expanded:
      return base.expand(shape);
  }
  return base;
}

void expect_values(const Tensor& got, const std::vector<double>& want, double rtol, double atol,
                   const std::string& context) {
  ASSERT_EQ(static_cast<std::size_t>(got.numel()), want.size()) << context;
  const std::vector<double> have = values(got);
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = have[i];
    const double w = want[i];
    const bool ok = (std::isnan(g) && std::isnan(w)) || g == w ||
                    (std::isfinite(w) && std::abs(g - w) <= atol + rtol * std::abs(w));
    if (!ok) {
      ADD_FAILURE() << context << ": element " << i << " (index "
                    << shape_str(unravel(static_cast<int64_t>(i), got.shape())) << " of shape "
                    << shape_str(got.shape()) << ") expected " << fmt::format("{}", w) << " got "
                    << fmt::format("{}", g);
      return;
    }
  }
}

double transcendental_rtol(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return 1e-2;
    case DType::F16:
      return 2e-3;
    case DType::F64:
      return 1e-12;
    default:
      return 2e-6;
  }
}

}  // namespace spmd::testing
