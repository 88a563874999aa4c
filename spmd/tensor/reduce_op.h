// spmd/tensor/reduce_op.h: ReduceOp, how the values of several tensors combine into one.
//
// The reduction of a collective (all_reduce, reduce_scatter, reduce) and of a Partial placement:
// the elementwise combination of every rank's tensor. It lives with the tensors because both
// collectives and placements (the op table's sharding vocabulary) use it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <spmd/core/format.h>

namespace spmd {

enum class ReduceOp { Sum, Avg, Product, Min, Max, BAnd, BOr, BXor };

// "sum", "avg", "product", "min", "max", "band", "bor", "bxor"; "?" for a value that is none.
std::string_view reduce_op_name(ReduceOp op);
// reduce_op_name, or "ReduceOp(42)" for a value that is no ReduceOp (how fmt prints one).
std::string reduce_op_str(ReduceOp op);
// Whether `op` is one of the enumerators (not an integer cast to ReduceOp).
inline bool is_valid(ReduceOp op) {
  return static_cast<unsigned>(op) <= static_cast<unsigned>(ReduceOp::BXor);
}
// Unsupported naming `op_name` (the operation) and the value unless is_valid(op).
void check_reduce_op(ReduceOp op, std::string_view op_name);
// Inverse of reduce_op_name (also "prod"); nullopt for anything else.
std::optional<ReduceOp> parse_reduce_op(std::string_view name);
// BAnd, BOr, BXor: defined for integer and Bool dtypes only.
inline bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor;
}

}  // namespace spmd

SPMD_FORMAT_AS_TEXT(spmd::ReduceOp, spmd::reduce_op_str(value))
