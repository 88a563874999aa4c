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
#include <string_view>
#include <utility>

#include <spmd/core/call_site.h>

namespace spmd {

// Base of every error spmdsim throws on purpose. Thrown while a public call runs, the message ends
// with the user's call site, " (at train.cpp:42)" (Note [User call sites] in core/call_site.h).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message)
      : std::runtime_error(message + call_site_suffix(message)) {}
  // The most specific class's name, as reports print it: "[rank 3] CommError: all_reduce ...".
  // Every subclass overrides it.
  virtual std::string_view type_name() const noexcept { return "Error"; }
};

// Shapes that do not fit: broadcasting, out-of-range dims or ranges, item() of a non-scalar.
class ShapeError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "ShapeError"; }
};
// DeviceMesh and Layout misuse: unknown or clashing dim names, bad slices, overlapping layouts.
class MeshError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "MeshError"; }
};
// DTensor placements that are invalid for the tensor or mesh, or cannot be converted.
class PlacementError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "PlacementError"; }
};
// A collective called with bad arguments (shapes or dtypes differing within a group, invalid
// src/dst, split sizes that do not add up), or a failure reported by MPI/NCCL.
class CommError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "CommError"; }
};
// Per-rank values whose answer differs between ranks where one answer is needed (a PerRank
// comparison, reconcile() of shards that differ, a replica that diverged), or a sharded op whose
// result differs from the same op on the full tensors (--spmd-debug=check).
class DivergenceError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "DivergenceError"; }
};
// A DTensor's values differ from the same program's on one rank (--spmd-debug=parity, or two
// value dumps compared by `spmd parity`); the message names the line, the op, the worst index and
// the last line that still agreed.
class ParityError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "ParityError"; }
};
// An op or collective produced NaN or Inf (--spmd-debug=nan); the message names the op, the
// rank and the index.
class NonFiniteError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "NonFiniteError"; }
};
// Ranks of one group issued different collectives (op, shape, dtype, root, ...), or a rank never
// arrived; the message lists each rank's call and source location.
class CollectiveMismatchError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "CollectiveMismatchError"; }
};
// A collective that can never complete: a member of its group has finished without making the
// call (threads; mpi: Note [Exit notices] in backends/mpi/exit_notice.h), or every unfinished rank
// waits in a collective that lacks a member (Note [Threads deadlock detection] in
// backends/threads/backend.h). A
// CollectiveMismatchError: on a cluster it is the same bug, a rank that did not make the call its
// peers made.
class DeadlockError : public CollectiveMismatchError {
 public:
  using CollectiveMismatchError::CollectiveMismatchError;
  std::string_view type_name() const noexcept override { return "DeadlockError"; }
};
// A rank waited for its peers longer than --spmd-timeout (SPMD_TIMEOUT): a peer is stuck outside
// the collective (an endless loop, a wait on something else) or is much slower than the timeout
// allows. The message names the collective, its file:line and what is known of every rank.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
  std::string_view type_name() const noexcept override { return "TimeoutError"; }
};
// A tensor allocation failed: the message names the op, the shape and dtype, and the bytes
// (Note [Out of memory] in tensor/factory.h).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "OutOfMemoryError"; }
};
// Local code whose SPMD types (R, I, V, P per mesh axis: world/spmd_types.h) contradict what an
// op, collective or from_local needs, or (--spmd-debug=types under sim) contradict the data; the
// message names the axis, the types and where each input got its type.
class TypeError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "TypeError"; }
};
// Valid input that this build, backend or dtype does not support.
class Unsupported : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "Unsupported"; }
};
// A bad value for an option, flag or environment variable (launch(), the CLI, topology files).
class ConfigError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "ConfigError"; }
};
// A CHECK that failed: a bug in spmdsim, never the user's fault.
class InternalError : public Error {
 public:
  using Error::Error;
  std::string_view type_name() const noexcept override { return "InternalError"; }
};

// Throws E with a fmt-formatted message: throw_error<ShapeError>("add: {} vs {}", a, b).
template <class E, class... Args>
[[noreturn]] void throw_error(fmt::format_string<Args...> format, Args&&... args) {
  throw E(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace spmd
