// spmd/backends/nccl/call.cpp: one call's parts, its fingerprint exchange and its results.
#include <spmd/backends/nccl/call.h>

#include <cstring>
#include <memory>

#include <fmt/ranges.h>

#include <spmd/collectives/fingerprint.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/core/format.h>

namespace spmd::nccl {

void Call::exchange_fingerprints(const CollectiveOptions& options, const CallSite& site) {
  const bool fingerprint = rt->fingerprint;
  const std::vector<const char*> received =
      exchange(sizeof(CollectiveFingerprint), [&](Part& p, char* out) {
        FingerprintInput input{&options, &p.input, dim_name, &p.member->members};
        if (fingerprint) {
          input.with_site = true;
          input.sequence = p.member->calls++;
          input.location = site.location;
        }
        const CollectiveFingerprint mine = make_fingerprint(input);
        std::memcpy(out, &mine, sizeof mine);
      });
  for (size_t k = 0; k < parts.size(); ++k) {
    const std::vector<int>& members = parts[k].member->members;
    std::vector<CollectiveFingerprint> all(static_cast<size_t>(n));
    std::memcpy(all.data(), received[k], all.size() * sizeof(CollectiveFingerprint));
    check_fingerprints(CollectiveCall{kind, dim_name, &members}, all, members, fingerprint);
  }
}

WorkPtr Call::finish(const LocalTensor& x) {
  std::vector<Tensor> shards;
  shards.reserve(parts.size());
  for (Part& p : parts) {
    rt->watchdog->track(p.device, p.stream, describe(p));
    shards.push_back(p.from_host ? p.result.to(cpu()) : std::move(p.result));
  }
  return std::make_shared<CompletedWork>(LocalTensor(x, std::move(shards)));
}

Call begin_call(NcclRuntime& rt, Communicator& comm, const LocalTensor& x,
                const CollectiveOptions& options, const CallSite& site) {
  const CollectiveKind kind = kind_of(options);
  auto* nccl_comm = dynamic_cast<NcclCommunicator*>(&comm);
  SPMD_CHECK(nccl_comm != nullptr);
  rt.check_usable(collective_name(kind));
  Call call;
  call.rt = &rt;
  call.kind = kind;
  call.dim_name = site.dim_name;
  if (x.ranks() != rt.ranks) {
    throw_error<CommError>(
        "{}: the nccl backend runs every rank this process holds ({}) in each collective, but the "
        "input holds ranks {}",
        kind, ranks_str(rt.ranks), ranks_str(x.ranks()));
  }
  for (size_t slot = 0; slot < rt.held.size(); ++slot) {
    const HeldRank& h = rt.held[slot];
    NcclCommunicator::Member& member = nccl_comm->members()[slot];
    if (member.comm == nullptr) {
      throw_error<CommError>("{}: rank {} is not in the mesh of dim '{}'", kind, h.rank,
                             site.dim_name);
    }
    Part p;
    p.slot = slot;
    p.rank = h.rank;
    p.device = h.device;
    p.stream = h.stream;
    p.member = &member;
    const Tensor& shard = x.shards()[slot];
    if (shard.device().is_cpu()) {
      p.input = shard.to(cuda(h.device));
      p.from_host = true;
    } else if (shard.device() != cuda(h.device)) {
      throw_error<CommError>("{}: rank {}'s shard is on {}, but rank {} runs on {}", kind, h.rank,
                             shard.device(), h.rank, cuda(h.device));
    } else {
      p.input = shard.contiguous();
    }
    call.parts.push_back(std::move(p));
  }
  call.n = static_cast<int>(call.parts.front().member->members.size());
  // Note [Point-to-point]: only two ranks make a transfer; its envelope goes with the data.
  if (!is_point_to_point(call.kind)) call.exchange_fingerprints(options, site);
  call.site = &site;
  return call;
}

}  // namespace spmd::nccl
