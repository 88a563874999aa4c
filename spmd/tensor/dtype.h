// spmd/tensor/dtype.h: element types, their sizes and names, and the promotion rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include <spmd/core/format.h>

#include <spmd/tensor/float8.h>
#include <spmd/tensor/half.h>

namespace spmd {

enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, Bool, F8E4M3FN, F8E5M2 };

inline constexpr DType kAllDTypes[] = {DType::F32,  DType::F64,      DType::BF16,
                                       DType::F16,  DType::I32,      DType::I64,
                                       DType::Bool, DType::F8E4M3FN, DType::F8E5M2};
// The dtypes with arithmetic kernels: all but the float8 ones, which are storage formats (Note
// [Float8] in tensor/float8.h).
inline constexpr DType kArithmeticDTypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                              DType::I32, DType::I64, DType::Bool};
inline constexpr DType kFloat8DTypes[] = {DType::F8E4M3FN, DType::F8E5M2};

// Bytes per element.
std::size_t itemsize(DType dtype);
// "f32", "f64", "bf16", "f16", "i32", "i64", "bool", "f8e4m3fn", "f8e5m2".
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; also accepts "float32", "float", "double", "bfloat16", "half", "int32",
// "int64", "int", "long", "float8_e4m3fn", "float8_e5m2". nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);
// Writes dtype_name (so gtest and iostreams print names, not numbers).
std::ostream& operator<<(std::ostream& os, DType dtype);

// Whether `dtype` is one of kAllDTypes (not an integer cast to DType).
inline bool is_valid(DType dtype) {
  return static_cast<uint8_t>(dtype) <= static_cast<uint8_t>(DType::F8E5M2);
}
// Unsupported naming `op` and the value, DType(42), unless is_valid(dtype).
void check_dtype(DType dtype, std::string_view op);
// Unsupported naming `op`, the value and the dtype when an integer dtype cannot hold `value` (a
// fill value or scalar): NaN, an infinity, or a number outside its range. Fractions truncate
// toward zero, as in a cast; floating and Bool dtypes take any value.
void check_fill_value(double value, DType dtype, std::string_view op);

inline bool is_float8(DType d) {
  return d == DType::F8E4M3FN || d == DType::F8E5M2;
}
inline bool is_floating(DType d) {
  return d == DType::F32 || d == DType::F64 || d == DType::BF16 || d == DType::F16 || is_float8(d);
}
inline bool is_integral(DType d) {
  return d == DType::I32 || d == DType::I64;
}

// Note [Type promotion]
// The dtype of a binary op's result (torch's rule for tensors of equal standing):
//   - same dtype -> that dtype;
//   - Bool with anything -> the other dtype;
//   - I32 with I64 -> I64;
//   - an integer with a float -> the float;
//   - F16 with BF16 -> F32 (neither holds the other);
//   - two floats otherwise -> the wider (F16/BF16 < F32 < F64).
// A Python-style scalar (double) operand does not change the tensor's dtype, except that an
// integer or Bool tensor combined with a non-integral scalar gives F32. True division (/) of two
// integer or Bool tensors gives F32. Reductions: sum of integers or Bool gives I64, mean of
// integers is an error, BF16/F16 reduce in F32 and round once.
// Float8 dtypes promote with nothing but themselves (PyTorch's rule): a float8 dtype with any
// other is Unsupported naming `op` and both dtypes.
DType promote_types(DType a, DType b, std::string_view op = "type promotion");

// The C++ element type of each dtype, and back.
template <DType D>
struct DTypeTraits;
template <>
struct DTypeTraits<DType::F32> {
  using type = float;
};
template <>
struct DTypeTraits<DType::F64> {
  using type = double;
};
template <>
struct DTypeTraits<DType::BF16> {
  using type = BFloat16;
};
template <>
struct DTypeTraits<DType::F16> {
  using type = Half;
};
template <>
struct DTypeTraits<DType::I32> {
  using type = int32_t;
};
template <>
struct DTypeTraits<DType::I64> {
  using type = int64_t;
};
template <>
struct DTypeTraits<DType::Bool> {
  using type = bool;
};
template <>
struct DTypeTraits<DType::F8E4M3FN> {
  using type = Float8E4M3FN;
};
template <>
struct DTypeTraits<DType::F8E5M2> {
  using type = Float8E5M2;
};
template <DType D>
using ctype_t = typename DTypeTraits<D>::type;

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<T, BFloat16>)
    return DType::BF16;
  else if constexpr (std::is_same_v<T, Half>)
    return DType::F16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::I32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::I64;
  else if constexpr (std::is_same_v<T, bool>)
    return DType::Bool;
  else if constexpr (std::is_same_v<T, Float8E4M3FN>)
    return DType::F8E4M3FN;
  else if constexpr (std::is_same_v<T, Float8E5M2>)
    return DType::F8E5M2;
  else
    static_assert(sizeof(T) == 0, "no spmd::DType for this C++ type");
}

// Calls fn.template operator()<T>() with T the element type of `dtype`, for every dtype (float8
// included: storage-level code such as copies, fills and printing):
//   dispatch_dtype(t.dtype(), [&]<class T>() { ... });
template <class F>
decltype(auto) dispatch_dtype(DType dtype, F&& fn) {
  switch (dtype) {
    case DType::F8E4M3FN:
      return fn.template operator()<Float8E4M3FN>();
    case DType::F8E5M2:
      return fn.template operator()<Float8E5M2>();
    case DType::F32:
      return fn.template operator()<float>();
    case DType::F64:
      return fn.template operator()<double>();
    case DType::BF16:
      return fn.template operator()<BFloat16>();
    case DType::F16:
      return fn.template operator()<Half>();
    case DType::I32:
      return fn.template operator()<int32_t>();
    case DType::I64:
      return fn.template operator()<int64_t>();
    case DType::Bool:
      return fn.template operator()<bool>();
  }
  return fn.template operator()<float>();  // unreachable: every enumerator is handled
}

// Unsupported naming `op` and the dtype: a float8 tensor reached an arithmetic kernel.
[[noreturn]] void throw_no_float8_kernel(DType dtype, std::string_view op);

template <class T>
inline constexpr bool is_float8_v =
    std::is_same_v<T, Float8E4M3FN> || std::is_same_v<T, Float8E5M2>;

// dispatch_dtype for arithmetic kernels: the dtypes of kArithmeticDTypes, so kernels are not
// compiled for the float8 storage formats; a float8 dtype is Unsupported naming `op`. Ops refuse
// float8 inputs before their kernels run (Note [Float8 ops] in ops/op.h): this is the backstop.
template <class F>
decltype(auto) dispatch_arithmetic(DType dtype, std::string_view op, F&& fn) {
  return dispatch_dtype(dtype, [&]<class T>() -> decltype(auto) {
    if constexpr (is_float8_v<T>) {
      throw_no_float8_kernel(dtype, op);
      return fn.template operator()<float>();  // not reached; gives every case one type
    } else {
      return fn.template operator()<T>();
    }
  });
}

// The element types that convert through float: the 16-bit and the 8-bit floats.
template <class T>
inline constexpr bool is_narrow_float_v =
    std::is_same_v<T, BFloat16> || std::is_same_v<T, Half> || is_float8_v<T>;

// Element conversions through the widest type that holds the value exactly. Floating to integer
// truncates toward zero and saturates at the integer's range, NaN giving 0 (a plain cast would
// be undefined behaviour there). Tensor conversions refuse such values before they get here (Note
// [Conversions to integers] in tensor/tensor.cpp); kernels rely on the saturation only for values
// they compute themselves.
template <class To, class From>
inline To convert_element(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_narrow_float_v<From>) {
    return convert_element<To>(static_cast<float>(v));
  } else if constexpr (is_narrow_float_v<To>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    // 2^(digits) is exact in every floating type; the largest To converts to it or below.
    constexpr From kLimit = static_cast<From>(std::numeric_limits<To>::max()) + From(1);
    if (!(v == v)) return To(0);
    if (v >= kLimit) return std::numeric_limits<To>::max();
    if (v <= -kLimit) return std::numeric_limits<To>::min();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace spmd

SPMD_FORMAT_AS_TEXT(spmd::DType, spmd::dtype_name(value))
