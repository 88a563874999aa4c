// spmd/collectives/functional.h: the functional collectives of the user API.
//
// Inputs are never modified; each call returns a new LocalTensor (or an Async handle for the
// _async forms). `dim` names the mesh dim whose groups take part (an index or a name). Every call
// resolves the dim, fetches the communicator for (dim layout, options) from the mesh universe's
// cache (created on first use), records a trace event, and runs the world's backend.
//
// Groups and roots: src/dst are ranks *within the group* (group rank 0 is the group's first
// rank in coordinate order). Under sim, every group of the dim whose ranks the input holds takes
// part; groups not fully held are skipped and their ranks are absent from the result (CommError
// when no group is fully held). Within a group shapes and dtypes must agree (except
// all_to_all_single's dim 0, which follows the split sizes); violations are a CommError naming
// the collective, the mesh dim, the group's ranks and the shapes.
//
//   LocalTensor g = all_reduce(grad, mesh, "dp", ReduceOp::Avg);
//   LocalTensor w = all_gather(shard, mesh, "tp", /*gather_dim=*/1);
//   auto pending = reduce_scatter_async(x, mesh, "tp");  ... ; LocalTensor y = pending.wait();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <vector>

#include <spmd/collectives/backend.h>
#include <spmd/collectives/types.h>
#include <spmd/core/call_site.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/world/local_tensor.h>

namespace spmd {

// The pending result of an _async collective.
template <class T>
class Async;

template <>
class Async<LocalTensor> {
 public:
  // `on_complete` runs once, when the result is first waited for, and returns the result the
  // caller gets (the same values; on the autograd tape when the input was).
  Async(WorkPtr work, std::function<LocalTensor(const LocalTensor&)> on_complete);
  // Blocks until the collective finished and returns what the synchronous call returns.
  // Subsequent calls return the same result.
  LocalTensor wait();
  bool ready() const;

 private:
  WorkPtr work_;
  // Closes the trace event, shows the result to the collective observer, records it on the tape.
  std::function<LocalTensor(const LocalTensor&)> on_complete_;
  LocalTensor result_;
};

// One finished collective, as the collective observer sees it.
struct CollectiveEvent {
  CollectiveKind kind;
  const World& world;
  const std::string& dim_name;
  const std::source_location& location;
  const LocalTensor& input;
  const LocalTensor& output;
};
// Sees every collective's result on the thread that waited for it, while set: the hook of
// --spmd-debug=nan (debug/). Null (the default) costs one relaxed atomic load per call.
using CollectiveObserver = void (*)(const CollectiveEvent& event);
void set_collective_observer(CollectiveObserver observer);

// The communicator of `mesh`'s dim `dim` (created and cached on first use).
std::shared_ptr<Communicator> communicator(const DeviceMesh& mesh, MeshDim dim,
                                           const CommOptions& options = {});

#define SPMD_HERE_ SourceLocation loc = SourceLocation::current()

// The collective `options` names, over the groups of `mesh`'s dim `dim`: the one path every named
// collective below takes (each is this call with its options).
//   LocalTensor w = collective(shard, mesh, "tp", AllGatherOptions{.gather_dim = 1});
LocalTensor collective(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                       CollectiveOptions options, SPMD_HERE_);
Async<LocalTensor> collective_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                    CollectiveOptions options, SPMD_HERE_);

// A collective spmdsim issues for its own checks (--spmd-debug=check,replicate under threads and
// mpi): on a communicator of its own (internal_comm_options(), collectives/backend.h), so the
// program's per-group sequence numbers stay as they are, and neither traced, observed nor recorded
// by autograd. Its calls meet only at the same user line on every rank (Communicator::is_internal).
// A rank that does not reach it is reported like any collective, at the current user call site.
LocalTensor internal_collective(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                CollectiveOptions options, SPMD_HERE_);

LocalTensor all_reduce(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                       ReduceOp op = ReduceOp::Sum, SPMD_HERE_);
LocalTensor all_reduce(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                       const AllReduceOptions& options, SPMD_HERE_);
LocalTensor all_gather(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                       int64_t gather_dim = 0, SPMD_HERE_);
LocalTensor reduce_scatter(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                           ReduceOp op = ReduceOp::Sum, int64_t scatter_dim = 0, SPMD_HERE_);
LocalTensor all_to_all(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                       int64_t split_dim = 0, int64_t concat_dim = 0, SPMD_HERE_);
LocalTensor all_to_all_single(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                              PerRank<std::vector<int64_t>> out_splits,
                              PerRank<std::vector<int64_t>> in_splits, SPMD_HERE_);
LocalTensor broadcast(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int src = 0,
                      SPMD_HERE_);
LocalTensor scatter(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int src = 0,
                    int64_t scatter_dim = 0, SPMD_HERE_);
LocalTensor gather(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int dst = 0,
                   int64_t gather_dim = 0, SPMD_HERE_);
LocalTensor reduce(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, ReduceOp op,
                   int dst = 0, SPMD_HERE_);
LocalTensor permute(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                    std::vector<int> dst_of, SPMD_HERE_);
// Over all ranks of `mesh`.
void barrier(const DeviceMesh& mesh, SPMD_HERE_);

Async<LocalTensor> all_reduce_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                    ReduceOp op = ReduceOp::Sum, SPMD_HERE_);
Async<LocalTensor> all_gather_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                    int64_t gather_dim = 0, SPMD_HERE_);
Async<LocalTensor> reduce_scatter_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                        ReduceOp op = ReduceOp::Sum, int64_t scatter_dim = 0,
                                        SPMD_HERE_);
Async<LocalTensor> all_to_all_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                    int64_t split_dim = 0, int64_t concat_dim = 0, SPMD_HERE_);
Async<LocalTensor> all_to_all_single_async(const LocalTensor& x, const DeviceMesh& mesh,
                                           MeshDim dim, PerRank<std::vector<int64_t>> out_splits,
                                           PerRank<std::vector<int64_t>> in_splits, SPMD_HERE_);
Async<LocalTensor> broadcast_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                   int src = 0, SPMD_HERE_);
Async<LocalTensor> scatter_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                 int src = 0, int64_t scatter_dim = 0, SPMD_HERE_);
Async<LocalTensor> gather_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                int dst = 0, int64_t gather_dim = 0, SPMD_HERE_);
Async<LocalTensor> reduce_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                ReduceOp op, int dst = 0, SPMD_HERE_);
Async<LocalTensor> permute_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                 std::vector<int> dst_of, SPMD_HERE_);

// ---- point-to-point (Note [Point-to-point] in collectives/types.h) --------------------------
//
// `dst` / `src` is a group rank of `mesh`'s dim `dim`; every rank the tensor holds takes part
// (under sim, typically every rank of one pipeline stage at once). Tags are checked, not used for
// pairing: the k-th send from a to b meets the k-th recv at b from a.
//
//   LocalTensor token = send(h, mesh, "pp", /*dst=*/stage + 1);            // stage s's ranks
//   LocalTensor x = recv(like, mesh, "pp", /*src=*/stage - 1);              // stage s+1's ranks
//
// send returns a token (x's ranks, each an empty [0] tensor). Under autograd, when x requires
// grad the receiver's result requires grad too: a backward through the receiver's result sends
// its gradient back, and backward(token) on the sender receives it into x's graph.
LocalTensor send(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int dst,
                 int64_t tag = 0, SPMD_HERE_);
// Receives into the ranks, shapes and dtype of `like` (its values are not read), as torch's recv
// fills a buffer.
LocalTensor recv(const LocalTensor& like, const DeviceMesh& mesh, MeshDim dim, int src,
                 int64_t tag = 0, SPMD_HERE_);
// The same without waiting: a send completes when its recv took it (threads, mpi, nccl) or at
// once (sim); wait() returns the token / the received tensor.
Async<LocalTensor> isend(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int dst,
                         int64_t tag = 0, SPMD_HERE_);
Async<LocalTensor> irecv(const LocalTensor& like, const DeviceMesh& mesh, MeshDim dim, int src,
                         int64_t tag = 0, SPMD_HERE_);

// One operation of batch_isend_irecv.
struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind = Kind::Send;
  LocalTensor tensor;  // what a send sends; the buffer a recv fills
  int peer = 0;        // the group rank it goes to or comes from
  int64_t tag = 0;
};
// Issues every send and then every recv without waiting (torch.distributed.batch_isend_irecv,
// NCCL's ncclGroupStart/End), so two ranks may exchange in both directions; the handles follow
// `ops`' order.
std::vector<Async<LocalTensor>> batch_isend_irecv(const std::vector<P2POp>& ops,
                                                  const DeviceMesh& mesh, MeshDim dim, SPMD_HERE_);

#undef SPMD_HERE_

}  // namespace spmd
