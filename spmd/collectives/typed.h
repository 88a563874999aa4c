// spmd/collectives/typed.h: the SPMD types of the local collectives (Note [SPMD types] in
// world/spmd_types.h): the type each one needs and gives along its mesh dim, the backward
// collective those types imply, and convert().
//
// Along the collective's dim (other axes keep their types):
//   all_reduce      Sum/Avg: P -> R (backward all_reduce), V -> I (backward: the identity, /n
//                   for Avg); Max/Min/...: V, R, I -> I (backward for Max/Min: the gradient to
//                   the ranks holding the extreme, split among ties; I: the identity; Product
//                   and the bitwise ops: none); R, I with Sum/Avg: error (a doubled reduction)
//   all_gather      V -> R (backward reduce_scatter); R, I are read as V; P: error
//   reduce_scatter  P -> V (backward all_gather); V is read as P; R, I: error (doubled reduction)
//   all_to_all(_single)  V -> V (backward: the reverse all_to_all); R, I read as V; P: error
//   broadcast       R, I, V -> R (backward: the gradient summed onto src); P: error
//   scatter         -> V (backward: gathered onto src); P: error
//   gather, reduce  V -> V, P -> V (reduce); not differentiable (non-roots get empty results, and
//                   a LocalTensor whose shards differ in shape carries no gradient)
//   permute         V -> V, P -> P (backward: the inverse permutation); R, I read as V
//   send            the token keeps the input's type; P: error. recv: -> V (what arrives differs
//                   per rank). Both are differentiable typed or not (Note [Point-to-point]:
//                   the backward of a send receives the gradient, that of a recv sends it)
// Under autograd a typed collective is recorded with that backward; an untyped one (types off)
// stays not differentiable (Unsupported at backward, naming the call).
#pragma once

#include <map>
#include <string>

#include <spmd/collectives/types.h>
#include <spmd/core/call_site.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/world/local_tensor.h>
#include <spmd/world/spmd_types.h>

namespace spmd {

// The output types of collective `options` over `mesh` dim `d` on an input of types `in` (null:
// untyped, gives null). TypeError at `loc` when the input's type along the dim contradicts the
// collective (the message names the axis, the type and where it came from).
TypesPtr collective_types(const TypesPtr& in, const CollectiveOptions& options,
                          const DeviceMesh& mesh, int d, const SourceLocation& loc);

// `result` of a typed collective on `x`, recorded for autograd with the backward its types imply
// (nothing is recorded when x takes no part in autograd).
LocalTensor record_typed_collective(const LocalTensor& x, const LocalTensor& result,
                                    const CollectiveOptions& options, const DeviceMesh& mesh, int d,
                                    const SourceLocation& loc);

// The type of axis `d` of `mesh` as `type`, from `via` at `loc` (with the axis's groups when the
// data check is on, and the mesh, which convert() uses).
AxisType axis_type(const DeviceMesh& mesh, int d, SpmdType type, std::string_view via,
                   const SourceLocation& loc);

// The same value meant, in another type, changing data locally (spmd_types' convert):
//   I -> R     no data change; backward all_reduces the gradient (Megatron's f operator)
//   R -> I     no data change; backward keeps the gradient on the axis's first rank
//   R, I -> V  no data change; backward: for I all_reduce, for R the gradient as is
//   R, I -> P  the axis's first rank keeps the value, the others hold zeros
//   V -> P     no data change
// Others need communication (P -> R is all_reduce, V -> R all_gather): TypeError. The axis's mesh
// must be known (its type came from a collective or to_local), else TypeError naming the axis.
LocalTensor convert(const LocalTensor& t, const std::map<std::string, SpmdType>& types,
                    SourceLocation loc = SourceLocation::current());

}  // namespace spmd
