// spmd/ops/op.h: OpDef, one entry of the op table, and call(), which runs an entry on Tensors.
//
// Everything about an op lives in its entry, in the spirit of PyTorch's native_functions.yaml and
// derivatives.yaml, in C++:
//   name         "matmul", as errors, traces and debug reports print it;
//   meta         the output's shape and dtype from the inputs' shapes and dtypes, no data: it
//                checks the inputs (ShapeError, Unsupported naming the op and the shapes) and is
//                all a shape-only run needs;
//   compute      the math on Tensors, given the meta's answer; it hands the arithmetic to the
//                DeviceOps of the inputs' device (CPU kernels, CUDA kernels: tensor/device_ops.h);
//   strategies   the ways the op can run on the pieces of sharded inputs: which placements each
//                input must have and which the output then has (ops/strategy.h has helpers);
//   piece        (optional) the computation on one rank's pieces when it differs from compute on
//                them (e.g. reshape to the rank's own output shape, an identity for empty pieces);
//   reference    (optional) the op on full tensors when it is not compute itself;
//   backward     the op's derivative, written with other table ops on Vars (ops/autograd.h);
//   follow_first_input  (elementwise ops) prefer the strategies that keep the first input's
//                placements, as PyTorch does (`w - lr * dw` keeps w's placements);
//   partial_use  how the op treats an input that is a pending sum (SPMD type P): whether it is
//                linear there, so the SPMD types keep P through it (world/spmd_types.h);
//   flops        (optional) the op's floating-point operations on full tensors of these shapes,
//                for the dry run's time estimate (debug/dry_run.h); ops without it count none;
//   composite    (optional) the op written with other table ops, which dispatch runs instead for
//                the input shardings `use_composite` accepts (and is given them): ops whose
//                sharded form needs collectives inside (cross_entropy over classes sharded
//                across ranks);
//   eager        (optional) the memory traffic of the separate kernels PyTorch eager runs for
//                the op where it has no fused kernel, for dry runs that model such a run
//                (Note [Eager kernels] in debug/dry_run.h);
//   float8       whether the op takes float8 inputs (Note [Float8 ops]);
//   split_dependent  (optional) whether, for these args, the op's result depends on how its
//                inputs are split over the mesh (FP8 training's rank-local scales, Note [Float8
//                training]): --spmd-debug=check then has no full-tensor op to hold it against.
// Entries are written with designated initializers (`.name = "matmul", .meta = ...`); all_ops()
// in ops/ops.h lists every entry of the table.
// The Tensor entry points (ops/ops.h), the LocalTensor ones (world/local_ops.h) and the DTensor
// ones (dtensor/ops.h) are one-line calls into an entry: call(), local_call(), dispatch().
// docs/design.md, "Adding an op", lists what a new op touches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spmd/ops/placement.h>
#include <spmd/ops/sharding.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

// The non-tensor arguments of an op that decide its result (dims, flags, scalars, shapes). Ints
// and reals key the sharding cache together with the inputs' specs; `seed` (the seed of a random
// op such as dropout) decides values but never the sharding, so equality and the hash leave it
// out and a new seed every step reuses the cached decision.
struct OpArgs {
  std::vector<int64_t> ints;
  std::vector<double> reals;
  uint64_t seed = 0;
  // Equal ints and reals (the seed is not compared: see above).
  bool operator==(const OpArgs& other) const { return ints == other.ints && reals == other.reals; }
  std::size_t hash() const;
  // "ints=[0, 1] reals=[2] seed=7" (empty parts left out).
  std::string to_string() const;
};

// What meta sees of an input: its shape and dtype.
struct InputMeta {
  const Shape* shape;
  DType dtype;
};

// The output's shape and dtype.
struct OpMeta {
  Shape shape;
  DType dtype = DType::F32;
};

// One way to run an op on pieces: the placements each input must have, and the output's.
struct OpStrategy {
  std::vector<Placements> inputs;
  Placements output;
};

using ShardingInputs = std::span<const ShardingSpec* const>;

// Where one rank's pieces sit: the rank, its mesh coordinate, the output's sharding and the
// output's local shape at that coordinate, and the inputs' shardings as the pieces are laid out
// (after the strategy's redistributions): an input's local_offset(coordinate) says which block of
// the global input a piece is (a vocabulary-sharded embedding masks the ids outside its rows).
struct PieceContext {
  int rank;
  const std::vector<int64_t>& coordinate;
  const ShardingSpec& output;
  const Shape& local_shape;
  ShardingInputs inputs = {};
};

// How PyTorch eager runs an op it has no fused kernel for: one kernel per step of the op's
// decomposition, each reading its inputs from memory and writing its output (Note [Eager
// kernels] in debug/dry_run.h). `of` is the op a dry run is told to model this way
// (SPMD_EAGER_OPS): a backward entry names its forward op. `bytes` is what those kernels read
// and write on inputs and an output of these (local) shapes and dtypes, forward or backward;
// `source` says whose decomposition it is (one line of the dry-run report).
struct EagerKernels {
  std::string_view of;
  double (*bytes)(std::span<const InputMeta> inputs, const OpArgs& args, const OpMeta& out);
  std::string_view source;
};

// The arguments of a backward function (ops/autograd.h).
class BackwardContext;
// A value that takes part in autograd (ops/autograd.h).
class Var;

// How an op treats an input that is a pending sum (SPMD type P, Note [SPMD types] in
// world/spmd_types.h): whether op(sum of parts) is the sum of op(part).
enum class PartialUse {
  None,       // not linear: a P input is an error
  Unary,      // linear in its one input (views, sum, scaling, casts)
  All,        // linear when every typed input is P (add, sub, cat, stack)
  One,        // bilinear: one input P, the others R (mul, matmul, bmm)
  Numerator,  // linear in the first input alone: it P, the others R (div, log_softmax_backward)
};

// What an op's backward reads of its values (Note [Saved values] in ops/autograd.h): bit i for
// input i, kSaveOutput for the output.
constexpr uint32_t kSaveOutput = 1u << 31;
constexpr uint32_t kSavesAll = ~0u;
constexpr uint32_t kSavesNone = 0u;
constexpr uint32_t kSavesInputs = ~kSaveOutput;
constexpr uint32_t saves_inputs(std::initializer_list<int> inputs) {
  uint32_t mask = 0;
  for (int i : inputs) mask |= 1u << i;
  return mask;
}

struct OpDef {
  std::string_view name;
  OpMeta (*meta)(std::span<const InputMeta> inputs, const OpArgs& args);
  Tensor (*compute)(std::span<const Tensor> inputs, const OpArgs& args, const OpMeta& out);
  // Candidate strategies for these input specs; each must be correct for the op; at least one
  // (the all-Replicate one is always correct).
  std::vector<OpStrategy> (*strategies)(ShardingInputs inputs, const OpArgs& args,
                                        const OpMeta& out);
  Tensor (*piece)(std::span<const Tensor> pieces, const OpArgs& args,
                  const PieceContext& where) = nullptr;
  Tensor (*reference)(std::span<const Tensor> inputs, const OpArgs& args) = nullptr;
  void (*backward)(BackwardContext& context) = nullptr;
  bool follow_first_input = false;
  PartialUse partial_use = PartialUse::None;
  double (*flops)(std::span<const InputMeta> inputs, const OpMeta& out) = nullptr;
  Var (*composite)(std::span<const Var> inputs, ShardingInputs shardings,
                   const OpArgs& args) = nullptr;
  bool (*use_composite)(ShardingInputs inputs, const OpArgs& args) = nullptr;
  // The values its backward reads (kSavesAll when unsure): a dry run's tape keeps only these
  // (Note [Saved values] in ops/autograd.h).
  uint32_t saves = kSavesAll;
  const EagerKernels* eager = nullptr;
  bool float8 = false;
  bool (*split_dependent)(const OpArgs& args) = nullptr;
};

// Note [Float8 ops]
// The float8 dtypes (Note [Float8] in tensor/float8.h) are storage formats, as in PyTorch: an op
// takes float8 inputs only when its entry says `.float8 = true`: the views and copies (reshape,
// transpose, permute, narrow, select, squeeze, unsqueeze, expand, contiguous, clone), cat, stack
// and pad (redistributing uneven shards pads them), the cast `to`, and the FP8 GEMMs, which compute
// on them in a wider type: scaled_mm, and float8_mm, FP8 training's linear, which casts its wider
// inputs itself and takes a weight already cast (Note [Float8 all-gather] in nn/parallel.h). Every
// other op refuses a float8 input with Unsupported naming the op and
// the dtype, in op_meta, before any kernel, under every kind of tensor (Tensor, LocalTensor,
// DTensor, shape-only ones included). Collectives move float8 tensors and refuse to reduce them
// (collectives/validate.cpp); the CUDA kernels refuse them (tensor/cuda/cuda_ops.cpp).

// Runs `op` on Tensors: the meta (which checks the inputs), then the computation. Error naming
// the op and the argument when an input is undefined.
Tensor call(const OpDef& op, std::span<const Tensor> inputs, const OpArgs& args = {});
inline Tensor call(const OpDef& op, std::initializer_list<Tensor> inputs, const OpArgs& args = {}) {
  return call(op, std::span<const Tensor>(inputs.begin(), inputs.size()), args);
}

// The output meta of `op` on inputs of these shapes and dtypes. Unsupported for a float8 input
// of an op that takes none (Note [Float8 ops]).
OpMeta op_meta(const OpDef& op, std::span<const Tensor> inputs, const OpArgs& args);
OpMeta op_meta(const OpDef& op, std::span<const InputMeta> inputs, const OpArgs& args);

// `op` on one rank's pieces: its piece function when it has one, else call().
Tensor compute_piece(const OpDef& op, std::span<const Tensor> pieces, const OpArgs& args,
                     const PieceContext& where);

// `op` on full tensors: its reference when it has one, else call().
Tensor reference(const OpDef& op, std::span<const Tensor> inputs, const OpArgs& args);

}  // namespace spmd
