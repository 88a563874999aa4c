// spmd/collectives/functional.cpp: the functional collectives: resolve the mesh dim, fetch the
// communicator, check each held rank's input, record the trace event, run the backend.
#include <spmd/collectives/functional.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include <spmd/collectives/cost_model.h>
#include <spmd/collectives/trace.h>
#include <spmd/collectives/typed.h>
#include <spmd/collectives/validate.h>
#include <spmd/core/error.h>
#include <spmd/ops/ops.h>
#include <spmd/world/local_ops.h>

namespace spmd {

namespace {
std::atomic<CollectiveObserver> g_observer{nullptr};
}  // namespace

void set_collective_observer(CollectiveObserver observer) {
  g_observer.store(observer, std::memory_order_relaxed);
}

Async<LocalTensor>::Async(WorkPtr work, std::function<LocalTensor(const LocalTensor&)> on_complete)
    : work_(std::move(work)), on_complete_(std::move(on_complete)) {}

LocalTensor Async<LocalTensor>::wait() {
  work_->wait();
  if (on_complete_) {
    auto on_complete = std::move(on_complete_);
    on_complete_ = nullptr;
    result_ = on_complete(work_->result());
  }
  return result_.defined() ? result_ : work_->result();
}

bool Async<LocalTensor>::ready() const {
  return work_->is_completed();
}

std::shared_ptr<Communicator> communicator(const DeviceMesh& mesh, MeshDim dim,
                                           const CommOptions& options) {
  const int d = mesh.resolve(dim);
  return mesh.comm_cache().get_or_create(mesh.dim_layout(d), options, [&] {
    return mesh.world().backend().make_communicator(mesh.group_family(d), options);
  });
}

namespace {

struct Prepared {
  Communicator* comm = nullptr;  // owned by the mesh universe's cache
  Backend* backend = nullptr;
  CallSite site;
  uint64_t trace_id = UINT64_MAX;
};

// The default-options communicator of dim d: the mesh handle's slot, else the universe cache.
Communicator& dim_communicator(const DeviceMesh& mesh, int d) {
  if (Communicator* cached = mesh.cached_communicator(d)) return *cached;
  std::shared_ptr<Communicator> comm = communicator(mesh, d);
  mesh.cache_communicator(d, comm.get());
  return *comm;
}

// check_local, on a parity run's reference world too (Note [Parity run] in debug/parity.h): there
// a collective whose arguments do not fit its collapsed dim (dst_of or split sizes of one entry
// per real rank, a src beyond 0) restarts the reference run with that dim kept at its size.
void check_local_args(const CollectiveCall& call, int rank, const Tensor& x, int64_t group_size,
                      const CollectiveOptions& options, const World& world,
                      const std::source_location& loc) {
  if (!world.state().parity_reference) return check_local(call, rank, x, group_size, options);
  try {
    check_local(call, rank, x, group_size, options);
  } catch (const CommError&) {
    const std::vector<std::string>& kept = world.state().parity_kept_dims;
    if (group_size != 1 || std::find(kept.begin(), kept.end(), call.dim_name) != kept.end()) {
      throw;
    }
    throw ParityRestart{0, call.dim_name, fmt::format("{} at {}", call.kind, site_text(loc))};
  }
}

// Everything before the backend call: checks each participating held rank's input and records
// the trace event (each participant with its group and that group's next sequence number).
Prepared prepare(const LocalTensor& x, Communicator& comm, const World& world, std::string dim_name,
                 const CollectiveOptions& options, const std::source_location& loc,
                 bool traced = true, const std::function<void()>& after_checks = nullptr) {
  // Note [User call sites]: a bad argument is reported at the user's line.
  const UserCallSite site(loc);
  const CollectiveKind kind = kind_of(options);
  if (!x.defined()) throw_error<CommError>("{}: the input LocalTensor is undefined", kind);
  check_input_ranks(kind, dim_name, x.ranks(), world);
  Prepared p;
  p.comm = &comm;
  p.backend = &world.backend();
  p.site = CallSite{loc, std::move(dim_name)};
  const GroupFamily& family = comm.family();
  const auto& groups = family.groups();
  const int64_t group_size = family.group_size();
  const bool lockstep = p.backend->is_lockstep();
  const size_t n = x.num_shards();

  // Group of each held rank (-1: not in this mesh) and how many held ranks each group has.
  thread_local std::vector<int64_t> group_of;
  thread_local std::vector<int64_t> held_in_group;
  thread_local std::vector<int64_t> sequence_of;
  group_of.assign(n, -1);
  held_in_group.assign(static_cast<size_t>(family.num_groups()), 0);
  if (lockstep) {
    // One walk over the (materialized) groups instead of locating each held rank: ranks outside
    // the mesh keep -1.
    for (size_t g = 0; g < groups.size(); ++g) {
      for (int rank : groups[g]) {
        if (auto i = x.position_of(rank)) {
          group_of[*i] = static_cast<int64_t>(g);
          ++held_in_group[g];
        }
      }
    }
  }
  for (size_t i = 0; i < n && !lockstep; ++i) {
    const int rank = x.ranks()[i];
    auto where = family.locate(rank);
    if (!where) {
      if (!lockstep) {
        throw_error<CommError>("{}: rank {} is not in the mesh of dim '{}'", kind, rank,
                               p.site.dim_name);
      }
      continue;
    }
    group_of[i] = where->group;
    ++held_in_group[static_cast<size_t>(where->group)];
  }

  Trace& t = trace();
  const bool tracing = traced && t.enabled();
  const bool listing = tracing && t.keeps_participants();
  TraceEvent event;
  if (listing) event.participants.reserve(n);
  sequence_of.assign(static_cast<size_t>(family.num_groups()), -1);
  const Tensor* first = nullptr;
  bool uniform_shapes = true;
  // Note [Shard classes]: equal shards pass or fail the same checks (but a ragged collective's
  // values are per rank: Note [Ragged collectives]), so each class is checked once.
  const std::vector<uint32_t>* classes = is_ragged(kind) ? nullptr : x.classes().get();
  std::vector<bool> class_checked(classes != nullptr ? x.num_classes() : 0, false);
  for (size_t i = 0; i < n; ++i) {
    const int64_t g = group_of[i];
    if (g < 0) continue;
    if (lockstep && held_in_group[static_cast<size_t>(g)] != group_size) continue;
    const int rank = x.ranks()[i];
    const Tensor& shard = x.shard_at(i);
    if (classes == nullptr || !class_checked[(*classes)[i]]) {
      CollectiveCall call{kind, p.site.dim_name, &groups[static_cast<size_t>(g)]};
      check_local_args(call, rank, shard, group_size, options, world, loc);
      if (classes != nullptr) class_checked[(*classes)[i]] = true;
    }
    if (sequence_of[static_cast<size_t>(g)] < 0) {
      sequence_of[static_cast<size_t>(g)] = static_cast<int64_t>(comm.next_sequence(g));
    }
    if (first == nullptr) {
      first = &shard;
    } else if (uniform_shapes && shard.shape() != first->shape()) {
      uniform_shapes = false;
    }
    if (tracing) ++event.participant_count;
    if (listing) {
      event.participants.push_back(
          TraceParticipant{rank, g, static_cast<uint64_t>(sequence_of[static_cast<size_t>(g)])});
    }
  }
  if (first == nullptr) {
    throw_error<CommError>(
        "{}: no group of mesh dim '{}' is fully held by the input (input ranks {}, groups of {} "
        "ranks such as {})",
        kind, p.site.dim_name, x.ranks(), group_size,
        groups.empty() ? std::vector<int>{} : groups[0]);
  }
  if (after_checks) after_checks();
  if (!tracing) return p;

  event.comm_id = comm.id();
  event.kind = kind;
  event.dim_name = p.site.dim_name;
  event.detail = describe(options);
  event.dtype = x.dtype();
  event.file = loc.file_name();
  event.function = loc.function_name();
  event.line = loc.line();
  event.shape = first->shape();
  if (!uniform_shapes) {
    for (const TraceParticipant& participant : event.participants) {
      event.rank_shapes.push_back(x.shard(participant.rank).shape());
    }
  }
  event.bytes = static_cast<int64_t>(first->nbytes());
  const Topology& topology = world.topology();
  event.estimate_us = collective_cost_us(kind, collective_cost_bytes(kind, event.bytes, group_size),
                                         group_size, comm.link(topology), topology);
  event.family = family;
  event.start_ns = t.now_ns();
  p.trace_id = t.begin(std::move(event));
  return p;
}

struct Issued {
  WorkPtr work;
  uint64_t trace_id;
};

// Note [Point-to-point]: send and recv take the path of the point-to-point section below.
LocalTensor p2p_result(const LocalTensor& x, const DeviceMesh& mesh, int d,
                       const CollectiveOptions& options, const SourceLocation& loc);
Async<LocalTensor> p2p_async(const LocalTensor& x, const DeviceMesh& mesh, int d,
                             const CollectiveOptions& options, const SourceLocation& loc);

// Note [Autograd] (ops/autograd.h): a collective on a typed LocalTensor is recorded with the
// backward its SPMD types imply (collectives/typed.h). An untyped one (made from a rank list, or
// the pieces of a DTensor handed around without to_local) says nothing about what its values
// mean, so its collective is recorded without a derivative: backward through it is an error
// naming the call.
void local_collective_backward(BackwardContext& c) {
  throw_error<Unsupported>(
      "backward: {} on a LocalTensor is not differentiable: a local collective's gradient depends "
      "on what the local values mean (SPMD types), and this LocalTensor is untyped (made from a "
      "rank list rather than a World, or taken from a DTensor without to_local); make it with "
      "LocalTensor::from_fn(world, ...), replicate(world, ...) or DTensor::to_local, or write the "
      "step with DTensor ops and redistribute",
      c.payload<std::string>());
}

LocalTensor on_tape(const LocalTensor& x, const LocalTensor& result, CollectiveKind kind,
                    const std::string& dim_name, const std::source_location& loc) {
  if (!grad_enabled() || !x.requires_grad() || !is_floating(result.dtype())) return result;
  auto where = std::make_shared<const std::string>(
      fmt::format("{} over mesh dim '{}' at {}", kind, dim_name, site_text(loc)));
  const Var in = local_var(x);
  return record(collective_name(kind), nullptr, {&in, 1}, {}, local_var(result),
                local_collective_backward, std::move(where))
      .value<LocalTensor>();
}

// Checks the input, then its SPMD types (null when untyped or in a derivative: Note [SPMD types];
// the arguments are checked first, so a bad argument is a CommError whatever the types), then
// issues the collective.
Issued issue_call(const LocalTensor& x, const DeviceMesh& mesh, int d,
                  const CollectiveOptions& options, const std::source_location& loc,
                  TypesPtr& types) {
  std::function<void()> type_check;
  if (x.spmd_types() != nullptr && types_active()) {
    type_check = [&] {
      const UserCallSite site(loc);
      types = collective_types(x.spmd_types(), options, mesh, d, loc);
    };
  }
  Prepared p = prepare(x, dim_communicator(mesh, d), mesh.world(), mesh.dim_name(d), options, loc,
                       /*traced=*/true, type_check);
  return Issued{p.backend->issue(*p.comm, x, options, p.site), p.trace_id};
}

}  // namespace

Async<LocalTensor> collective_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                    CollectiveOptions options, SourceLocation caller) {
  // Note [User call sites]: a collective a DTensor op issues is reported at the op's line.
  const SourceLocation loc = user_site_or(caller);
  const int d = mesh.resolve(dim);
  if (is_point_to_point(kind_of(options))) [[unlikely]]
    return p2p_async(x, mesh, d, options, loc);
  TypesPtr types;
  Issued issued = issue_call(x, mesh, d, options, loc, types);
  const uint64_t id = issued.trace_id;
  CollectiveObserver observer = g_observer.load(std::memory_order_relaxed);
  const bool tape = grad_enabled() && x.requires_grad();
  if (types != nullptr) [[unlikely]] {
    return Async<LocalTensor>(std::move(issued.work), [id, observer, options, x, mesh, d, loc,
                                                       types](const LocalTensor& result) {
      if (id != UINT64_MAX) trace().finish(id);
      if (observer != nullptr) {
        observer(CollectiveEvent{kind_of(options), mesh.world(), mesh.dim_name(d), loc, x, result});
      }
      return record_typed_collective(x, result.with_types(types), options, mesh, d, loc);
    });
  }
  if (observer == nullptr && !tape) {
    if (id == UINT64_MAX) return Async<LocalTensor>(std::move(issued.work), nullptr);
    return Async<LocalTensor>(std::move(issued.work), [id](const LocalTensor& result) {
      trace().finish(id);
      return result;
    });
  }
  return Async<LocalTensor>(std::move(issued.work),
                            [id, observer, kind = kind_of(options), x, world = mesh.world(),
                             dim_name = mesh.dim_name(d), loc](const LocalTensor& result) {
                              if (id != UINT64_MAX) trace().finish(id);
                              if (observer != nullptr)
                                observer(CollectiveEvent{kind, world, dim_name, loc, x, result});
                              return on_tape(x, result, kind, dim_name, loc);
                            });
}

// The synchronous form: waits and moves the result out of the only Work handle.
LocalTensor collective(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                       CollectiveOptions options, SourceLocation caller) {
  // Note [User call sites]: a collective a DTensor op issues is reported at the op's line.
  const SourceLocation loc = user_site_or(caller);
  const int d = mesh.resolve(dim);
  if (is_point_to_point(kind_of(options))) [[unlikely]]
    return p2p_result(x, mesh, d, options, loc);
  TypesPtr types;
  Issued issued = issue_call(x, mesh, d, options, loc, types);
  issued.work->wait();
  if (issued.trace_id != UINT64_MAX) trace().finish(issued.trace_id);
  LocalTensor result = issued.work->take_result();
  if (CollectiveObserver observer = g_observer.load(std::memory_order_relaxed)) [[unlikely]] {
    observer(CollectiveEvent{kind_of(options), mesh.world(), mesh.dim_name(d), loc, x, result});
  }
  if (types != nullptr) [[unlikely]]
    return record_typed_collective(x, result.with_types(std::move(types)), options, mesh, d, loc);
  if (x.requires_grad()) [[unlikely]] {
    return on_tape(x, result, kind_of(options), mesh.dim_name(d), loc);
  }
  return result;
}

LocalTensor internal_collective(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                CollectiveOptions options, SourceLocation caller) {
  const SourceLocation loc = user_site_or(caller);
  const int d = mesh.resolve(dim);
  if (is_point_to_point(kind_of(options))) {
    throw_error<Unsupported>("internal_collective: {} is point-to-point, not a group collective",
                             kind_of(options));
  }
  std::shared_ptr<Communicator> comm = communicator(mesh, d, internal_comm_options());
  // Reports name it as what it is: "all_gather over 'tp (--spmd-debug check)' at train.cpp:42".
  Prepared p = prepare(x, *comm, mesh.world(), mesh.dim_name(d) + " (--spmd-debug check)", options,
                       loc, /*traced=*/false);
  WorkPtr work = p.backend->issue(*p.comm, x, options, p.site);
  work->wait();
  return work->take_result();
}

// ---- the named collectives: each is collective() with its options ---------------------------

LocalTensor all_reduce(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, ReduceOp op,
                       SourceLocation loc) {
  return collective(x, mesh, dim, AllReduceOptions{op}, loc);
}
LocalTensor all_reduce(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                       const AllReduceOptions& options, SourceLocation loc) {
  return collective(x, mesh, dim, options, loc);
}
LocalTensor all_gather(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                       int64_t gather_dim, SourceLocation loc) {
  return collective(x, mesh, dim, AllGatherOptions{gather_dim}, loc);
}
LocalTensor reduce_scatter(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, ReduceOp op,
                           int64_t scatter_dim, SourceLocation loc) {
  return collective(x, mesh, dim, ReduceScatterOptions{op, scatter_dim}, loc);
}
LocalTensor all_to_all(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int64_t split_dim,
                       int64_t concat_dim, SourceLocation loc) {
  return collective(x, mesh, dim, AllToAllOptions{split_dim, concat_dim}, loc);
}
LocalTensor all_to_all_single(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                              PerRank<std::vector<int64_t>> out_splits,
                              PerRank<std::vector<int64_t>> in_splits, SourceLocation loc) {
  return collective(x, mesh, dim,
                    AllToAllSingleOptions{std::move(out_splits), std::move(in_splits)}, loc);
}
LocalTensor broadcast(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int src,
                      SourceLocation loc) {
  return collective(x, mesh, dim, BroadcastOptions{src}, loc);
}
LocalTensor scatter(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int src,
                    int64_t scatter_dim, SourceLocation loc) {
  return collective(x, mesh, dim, ScatterOptions{src, scatter_dim}, loc);
}
LocalTensor gather(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int dst,
                   int64_t gather_dim, SourceLocation loc) {
  return collective(x, mesh, dim, GatherOptions{dst, gather_dim}, loc);
}
LocalTensor reduce(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, ReduceOp op, int dst,
                   SourceLocation loc) {
  return collective(x, mesh, dim, ReduceOptions{op, dst}, loc);
}
LocalTensor permute(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                    std::vector<int> dst_of, SourceLocation loc) {
  return collective(x, mesh, dim, PermuteOptions{std::move(dst_of)}, loc);
}

Async<LocalTensor> all_reduce_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                    ReduceOp op, SourceLocation loc) {
  return collective_async(x, mesh, dim, AllReduceOptions{op}, loc);
}
Async<LocalTensor> all_gather_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                    int64_t gather_dim, SourceLocation loc) {
  return collective_async(x, mesh, dim, AllGatherOptions{gather_dim}, loc);
}
Async<LocalTensor> reduce_scatter_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                        ReduceOp op, int64_t scatter_dim, SourceLocation loc) {
  return collective_async(x, mesh, dim, ReduceScatterOptions{op, scatter_dim}, loc);
}
Async<LocalTensor> all_to_all_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                    int64_t split_dim, int64_t concat_dim, SourceLocation loc) {
  return collective_async(x, mesh, dim, AllToAllOptions{split_dim, concat_dim}, loc);
}
Async<LocalTensor> all_to_all_single_async(const LocalTensor& x, const DeviceMesh& mesh,
                                           MeshDim dim, PerRank<std::vector<int64_t>> out_splits,
                                           PerRank<std::vector<int64_t>> in_splits,
                                           SourceLocation loc) {
  return collective_async(x, mesh, dim,
                          AllToAllSingleOptions{std::move(out_splits), std::move(in_splits)}, loc);
}
Async<LocalTensor> broadcast_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                   int src, SourceLocation loc) {
  return collective_async(x, mesh, dim, BroadcastOptions{src}, loc);
}
Async<LocalTensor> scatter_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int src,
                                 int64_t scatter_dim, SourceLocation loc) {
  return collective_async(x, mesh, dim, ScatterOptions{src, scatter_dim}, loc);
}
Async<LocalTensor> gather_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int dst,
                                int64_t gather_dim, SourceLocation loc) {
  return collective_async(x, mesh, dim, GatherOptions{dst, gather_dim}, loc);
}
Async<LocalTensor> reduce_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                ReduceOp op, int dst, SourceLocation loc) {
  return collective_async(x, mesh, dim, ReduceOptions{op, dst}, loc);
}
Async<LocalTensor> permute_async(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim,
                                 std::vector<int> dst_of, SourceLocation loc) {
  return collective_async(x, mesh, dim, PermuteOptions{std::move(dst_of)}, loc);
}

// ---- point-to-point (Note [Point-to-point]) ----------------------------------------------------

namespace {

// What the backward of a send or a recv needs.
struct P2PBackward {
  DeviceMesh mesh;
  int dim;
  int peer;
  int64_t tag;
  LocalTensor like;  // send: the sent tensor (its ranks, shapes and dtype: where the gradient goes)
};

// The backward of a send: the gradient of what it sent comes back from the receiver.
void send_backward(BackwardContext& c) {
  const auto& p = c.payload<P2PBackward>();
  c.set_grad(0, local_var(p2p_result(p.like, p.mesh, p.dim, RecvOptions{p.peer, p.tag},
                                     current_call_site() != nullptr ? *current_call_site()
                                                                    : SourceLocation::current())));
}

// The backward of a recv: its gradient goes back to the sender. The input is the received leaf,
// which collects nothing.
void recv_backward(BackwardContext& c) {
  const auto& p = c.payload<P2PBackward>();
  p2p_result(c.grad().as<LocalTensor>().with_types(nullptr), p.mesh, p.dim,
             SendOptions{p.peer, p.tag},
             current_call_site() != nullptr ? *current_call_site() : SourceLocation::current());
}

int peer_of(const CollectiveOptions& options) {
  if (const auto* s = std::get_if<SendOptions>(&options)) return s->peer;
  if (const auto* r = std::get_if<RecvOptions>(&options)) return r->peer;
  return -1;
}

int64_t tag_of(const CollectiveOptions& options) {
  if (const auto* s = std::get_if<SendOptions>(&options)) return s->tag;
  if (const auto* r = std::get_if<RecvOptions>(&options)) return r->tag;
  return 0;
}

// Checks every held rank's part (each in the group of the dim that holds it), then the types,
// records the trace event and issues the transfer. Point-to-point calls take no sequence number:
// only two ranks of a group make them.
Issued issue_p2p(const LocalTensor& x, const DeviceMesh& mesh, int d,
                 const CollectiveOptions& options, const SourceLocation& loc, TypesPtr& types) {
  const UserCallSite user_site(loc);  // Note [User call sites]: a bad argument at the user's line
  const CollectiveKind kind = kind_of(options);
  const std::string dim_name = mesh.dim_name(d);
  if (!x.defined()) throw_error<CommError>("{}: the input LocalTensor is undefined", kind);
  const World& world = mesh.world();
  check_input_ranks(kind, dim_name, x.ranks(), world);
  Communicator& comm = dim_communicator(mesh, d);
  const GroupFamily& family = comm.family();
  const auto& groups = family.groups();
  Trace& t = trace();
  const bool tracing = t.enabled();
  TraceEvent event;
  for (size_t i = 0; i < x.num_shards(); ++i) {
    const int rank = x.ranks()[i];
    const auto where = family.locate(rank);
    if (!where) {
      throw_error<CommError>("{} over mesh dim '{}': rank {} is not in mesh {}", kind, dim_name,
                             rank, mesh.to_string());
    }
    const CollectiveCall call{kind, dim_name, &groups[static_cast<size_t>(where->group)]};
    check_local_args(call, rank, x.shard_at(i), family.group_size(), options, world, loc);
    if (tracing) {
      ++event.participant_count;
      if (t.keeps_participants()) {
        event.participants.push_back(TraceParticipant{rank, where->group, 0});
      }
    }
  }
  if (x.spmd_types() != nullptr && types_active()) {
    types = collective_types(x.spmd_types(), options, mesh, d, loc);
  }
  uint64_t trace_id = UINT64_MAX;
  if (tracing && x.num_shards() > 0) {
    const Tensor& first = x.shard_at(0);
    event.comm_id = comm.id();
    event.kind = kind;
    event.dim_name = dim_name;
    event.detail = describe(options);
    event.dtype = x.dtype();
    event.file = loc.file_name();
    event.function = loc.function_name();
    event.line = loc.line();
    event.shape = first.shape();
    event.bytes = static_cast<int64_t>(first.nbytes());
    const Topology& topology = world.topology();
    event.estimate_us =
        collective_cost_us(kind, event.bytes, family.group_size(), comm.link(topology), topology);
    event.family = family;
    event.start_ns = t.now_ns();
    trace_id = t.begin(std::move(event));
  }
  const bool requires_grad = std::holds_alternative<SendOptions>(options) && grad_enabled() &&
                             x.requires_grad() && is_floating(x.dtype());
  CallSite site{loc, dim_name, requires_grad};
  return Issued{world.backend().issue(comm, x, options, site), trace_id};
}

// What the caller gets once the transfer completed: the token of a send (recorded for autograd
// when x requires grad), the received tensor of a recv (recorded when the sender's required grad).
LocalTensor finish_p2p(const LocalTensor& x, LocalTensor result, const DeviceMesh& mesh, int d,
                       const CollectiveOptions& options, const SourceLocation& loc,
                       const TypesPtr& types, uint64_t trace_id) {
  if (trace_id != UINT64_MAX) trace().finish(trace_id);
  const CollectiveKind kind = kind_of(options);
  if (CollectiveObserver observer = g_observer.load(std::memory_order_relaxed)) [[unlikely]] {
    observer(CollectiveEvent{kind, mesh.world(), mesh.dim_name(d), loc, x, result});
  }
  const bool received_grad = result.requires_grad();
  if (received_grad) result = result.detach();
  if (types != nullptr) result = std::move(result).with_types(types);
  if (!grad_enabled()) return result;
  auto payload = [&](LocalTensor like) {
    return std::make_shared<const P2PBackward>(
        P2PBackward{mesh, d, peer_of(options), tag_of(options), std::move(like)});
  };
  if (kind == CollectiveKind::Send && x.requires_grad() && is_floating(x.dtype())) {
    const Var in = local_var(x);
    return record("send", nullptr, {&in, 1}, {}, local_var(result), send_backward,
                  payload(x.detach().with_types(nullptr)))
        .value<LocalTensor>();
  }
  if (kind == CollectiveKind::Recv && received_grad) {
    // The input is a leaf standing for the sender's graph (it collects nothing).
    LocalTensor anchor = result.detach().with_types(nullptr);
    anchor.requires_grad_(true);
    const Var in = local_var(anchor);
    return record("recv", nullptr, {&in, 1}, {}, local_var(result), recv_backward,
                  payload(LocalTensor()))
        .value<LocalTensor>();
  }
  return result;
}

LocalTensor p2p_result(const LocalTensor& x, const DeviceMesh& mesh, int d,
                       const CollectiveOptions& options, const SourceLocation& loc) {
  TypesPtr types;
  Issued issued = issue_p2p(x, mesh, d, options, loc, types);
  issued.work->wait();
  return finish_p2p(x, issued.work->take_result(), mesh, d, options, loc, types, issued.trace_id);
}

Async<LocalTensor> p2p_async(const LocalTensor& x, const DeviceMesh& mesh, int d,
                             const CollectiveOptions& options, const SourceLocation& loc) {
  TypesPtr types;
  Issued issued = issue_p2p(x, mesh, d, options, loc, types);
  return Async<LocalTensor>(
      std::move(issued.work),
      [x, mesh, d, options, loc, types, id = issued.trace_id](const LocalTensor& result) {
        return finish_p2p(x, result, mesh, d, options, loc, types, id);
      });
}

}  // namespace

LocalTensor send(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int dst, int64_t tag,
                 SourceLocation caller) {
  const SourceLocation loc = user_site_or(caller);
  return p2p_result(x, mesh, mesh.resolve(dim), SendOptions{dst, tag}, loc);
}

LocalTensor recv(const LocalTensor& like, const DeviceMesh& mesh, MeshDim dim, int src, int64_t tag,
                 SourceLocation caller) {
  const SourceLocation loc = user_site_or(caller);
  return p2p_result(like, mesh, mesh.resolve(dim), RecvOptions{src, tag}, loc);
}

Async<LocalTensor> isend(const LocalTensor& x, const DeviceMesh& mesh, MeshDim dim, int dst,
                         int64_t tag, SourceLocation caller) {
  const SourceLocation loc = user_site_or(caller);
  return p2p_async(x, mesh, mesh.resolve(dim), SendOptions{dst, tag}, loc);
}

Async<LocalTensor> irecv(const LocalTensor& like, const DeviceMesh& mesh, MeshDim dim, int src,
                         int64_t tag, SourceLocation caller) {
  const SourceLocation loc = user_site_or(caller);
  return p2p_async(like, mesh, mesh.resolve(dim), RecvOptions{src, tag}, loc);
}

std::vector<Async<LocalTensor>> batch_isend_irecv(const std::vector<P2POp>& ops,
                                                  const DeviceMesh& mesh, MeshDim dim,
                                                  SourceLocation caller) {
  const SourceLocation loc = user_site_or(caller);
  const int d = mesh.resolve(dim);
  std::vector<std::optional<Async<LocalTensor>>> handles(ops.size());
  for (const P2POp::Kind pass : {P2POp::Kind::Send, P2POp::Kind::Recv}) {
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      if (op.kind != pass) continue;
      const CollectiveOptions options = op.kind == P2POp::Kind::Send
                                            ? CollectiveOptions{SendOptions{op.peer, op.tag}}
                                            : CollectiveOptions{RecvOptions{op.peer, op.tag}};
      handles[i] = p2p_async(op.tensor, mesh, d, options, loc);
    }
  }
  std::vector<Async<LocalTensor>> out;
  out.reserve(ops.size());
  for (auto& h : handles) out.push_back(std::move(*h));
  return out;
}

void barrier(const DeviceMesh& mesh, SourceLocation loc) {
  const World& world = mesh.world();
  // Every rank of the mesh as one group: the mesh layout nested into a single mode.
  GroupFamily family = mesh.universe()->group_family(nest(mesh.layout()), "all");
  auto comm = mesh.comm_cache().get_or_create(family.layout(), CommOptions{}, [&] {
    return world.backend().make_communicator(family, CommOptions{});
  });
  std::vector<int> held;
  for (int r : world.held_ranks()) {
    if (mesh.contains(r)) held.push_back(r);
  }
  if (held.empty()) throw_error<CommError>("barrier: no held rank is in mesh {}", mesh);
  LocalTensor token = LocalTensor::replicate(held, zeros({0}));
  const CollectiveOptions options = BarrierOptions{};
  Prepared p = prepare(token, *comm, world, family.dim_name(), options, loc);
  WorkPtr work = p.backend->issue(*p.comm, token, options, p.site);
  work->wait();
  trace().finish(p.trace_id);
}

}  // namespace spmd
