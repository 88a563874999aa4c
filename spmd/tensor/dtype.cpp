// spmd/tensor/dtype.cpp: dtype sizes, names and Note [Type promotion].
#include <spmd/tensor/dtype.h>

#include <algorithm>
#include <cctype>
#include <ostream>
#include <string>

#include <spmd/core/error.h>

namespace spmd {

std::size_t itemsize(DType dtype) {
  return dispatch_dtype(dtype, []<class T>() { return sizeof(T); });
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::Bool:
      return "bool";
    case DType::F8E4M3FN:
      return "f8e4m3fn";
    case DType::F8E5M2:
      return "f8e5m2";
  }
  return "?";
}

void check_dtype(DType dtype, std::string_view op) {
  if (!is_valid(dtype)) {
    throw_error<Unsupported>(
        "{}: DType({}) is not a dtype (f32, f64, bf16, f16, i32, i64, bool, f8e4m3fn, "
        "f8e5m2)",
        op, static_cast<int>(dtype));
  }
}

void check_fill_value(double value, DType dtype, std::string_view op) {
  if (!is_integral(dtype)) return;
  // 2^63 and 2^31 are exact doubles. i32 holds [-2^31, 2^31); i64 also takes 2^63, the double
  // that INT64_MAX rounds to (it saturates back to INT64_MAX).
  const bool wide = dtype == DType::I64;
  const double limit = wide ? 0x1p63 : 0x1p31;
  if (!(value >= -limit && (value < limit || (wide && value == limit)))) {
    throw_error<Unsupported>(
        "{}: the value {} cannot be held by dtype {} (integers in [{}, {}])", op, value, dtype,
        wide ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int32_t>::min(),
        wide ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int32_t>::max());
  }
}

std::optional<DType> parse_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (DType d : kAllDTypes) {
    if (lower == dtype_name(d)) return d;
  }
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float32", DType::F32},        {"float", DType::F32},     {"float64", DType::F64},
      {"double", DType::F64},         {"bfloat16", DType::BF16}, {"float16", DType::F16},
      {"half", DType::F16},           {"int32", DType::I32},     {"int", DType::I32},
      {"int64", DType::I64},          {"long", DType::I64},      {"float8_e4m3fn", DType::F8E4M3FN},
      {"float8_e5m2", DType::F8E5M2},
  };
  for (const Alias& alias : kAliases) {
    if (lower == alias.name) return alias.dtype;
  }
  return std::nullopt;
}

std::ostream& operator<<(std::ostream& os, DType dtype) {
  return os << dtype_name(dtype);
}

namespace {

// Width rank among floats: F16 and BF16 share the lowest rank.
int float_rank(DType d) {
  switch (d) {
    case DType::F64:
      return 2;
    case DType::F32:
      return 1;
    default:
      return 0;
  }
}

}  // namespace

void throw_no_float8_kernel(DType dtype, std::string_view op) {
  throw_error<Unsupported>(
      "{}: no kernel for dtype {}: float8 tensors are a storage format with casts, copies, views, "
      "cat and scaled_mm only, as in PyTorch (Note [Float8] in spmd/tensor/float8.h); convert "
      "with to(DType::BF16) or to(DType::F32) first",
      op, dtype);
}

DType promote_types(DType a, DType b, std::string_view op) {
  if (a == b) return a;
  if (is_float8(a) || is_float8(b)) {
    throw_error<Unsupported>(
        "{}: float8 dtypes promote with no other dtype ({} with {}), as in PyTorch; convert one "
        "side with to() first",
        op, a, b);
  }
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  if (is_integral(a) && is_integral(b)) return DType::I64;
  if (is_integral(a)) return b;
  if (is_integral(b)) return a;
  if (float_rank(a) == float_rank(b)) return DType::F32;  // F16 with BF16
  return float_rank(a) > float_rank(b) ? a : b;
}

}  // namespace spmd
