// spmd/tensor/reduce_op.cpp: names of the reduce ops.
#include <spmd/tensor/reduce_op.h>

#include <array>

#include <spmd/core/error.h>

namespace spmd {
namespace {
constexpr std::array<std::string_view, 8> kReduceOpNames = {"sum", "avg",  "product", "min",
                                                            "max", "band", "bor",     "bxor"};
}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  const auto i = static_cast<std::size_t>(op);
  return i < kReduceOpNames.size() ? kReduceOpNames[i] : std::string_view("?");
}

std::string reduce_op_str(ReduceOp op) {
  if (!is_valid(op)) return fmt::format("ReduceOp({})", static_cast<int>(op));
  return std::string(reduce_op_name(op));
}

void check_reduce_op(ReduceOp op, std::string_view op_name) {
  if (!is_valid(op)) {
    throw_error<Unsupported>(
        "{}: {} is not a reduce op (sum, avg, product, min, max, band, bor, bxor)", op_name,
        reduce_op_str(op));
  }
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) {
  if (name == "prod") return ReduceOp::Product;
  for (std::size_t i = 0; i < kReduceOpNames.size(); ++i) {
    if (kReduceOpNames[i] == name) return static_cast<ReduceOp>(i);
  }
  return std::nullopt;
}

}  // namespace spmd
