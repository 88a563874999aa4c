// spmd/core/error.h: the typed exceptions of spmdsim.
//
// Two kinds of failure, as in gloo: a user error (bad input, a mismatched collective, a mesh
// operation that cannot be done) throws a subclass of spmd::Error whose message starts with
// the operation and names the mesh, dim, ranks or shapes involved; a broken internal invariant
// fails a CHECK macro (core/check.h), which throws InternalError with file:line, the expression
// and both operands. Pick the most specific type.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace spmd {

// Base of every error spmdsim throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Shapes that do not fit: broadcasting, out-of-range dims or ranges, item() of a non-scalar.
class ShapeError : public Error {
  using Error::Error;
};
// DeviceMesh and Layout misuse: unknown or clashing dim names, bad slices, overlapping layouts.
class MeshError : public Error {
  using Error::Error;
};
// DTensor placements that are invalid for the tensor or mesh, or cannot be converted.
class PlacementError : public Error {
  using Error::Error;
};
// A collective called with bad arguments (shapes or dtypes differing within a group, invalid
// src/dst, split sizes that do not add up), or a failure reported by MPI/NCCL.
class CommError : public Error {
  using Error::Error;
};
// Per-rank values whose answer differs between ranks where one answer is needed (a PerRank
// comparison, reconcile() of shards that differ, a replica that diverged), or a sharded op whose
// result differs from the same op on the full tensors (--spmd-debug=check).
class DivergenceError : public Error {
  using Error::Error;
};
// An op or collective produced NaN or Inf (--spmd-debug=nan); the message names the op, the
// rank and the index.
class NonFiniteError : public Error {
  using Error::Error;
};
// Ranks of one group issued different collectives (op, shape, dtype, root, ...), or a rank never
// arrived; the message lists each rank's call and source location.
class CollectiveMismatchError : public Error {
  using Error::Error;
};
// Valid input that this build, backend or dtype does not support.
class Unsupported : public Error {
  using Error::Error;
};
// A bad value for an option, flag or environment variable (launch(), the CLI, topology files).
class ConfigError : public Error {
  using Error::Error;
};
// A CHECK that failed: a bug in spmdsim, never the user's fault.
class InternalError : public Error {
  using Error::Error;
};

// Throws E with a fmt-formatted message: throw_error<ShapeError>("add: {} vs {}", a, b).
template <class E, class... Args>
[[noreturn]] void throw_error(fmt::format_string<Args...> format, Args&&... args) {
  throw E(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace spmd
