// spmd/backends/mpi/call.cpp: preparing one call, and its signature exchange
// (Note [Signature exchange]).
#include <spmd/backends/mpi/call.h>

#include <memory>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <spmd/backends/mpi/exit_notice.h>
#include <spmd/backends/mpi/state.h>
#include <spmd/backends/mpi/watchdog.h>
#include <spmd/collectives/fingerprint.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>

namespace spmd::mpi {
namespace {

// The signature exchange's buffers: they must outlive a request that is given up on.
struct SignatureBuffers {
  CollectiveFingerprint mine;
  std::vector<CollectiveFingerprint> all;
};

}  // namespace

void exchange_signatures(const Call& call, const CollectiveOptions& options, const CallSite& site,
                         bool fingerprint) {
  // The debug checks' own collectives also meet by the user's line (Communicator::is_internal).
  const bool internal = call.comm->is_internal();
  fingerprint = fingerprint || internal;
  FingerprintInput input{&options, &call.input, site.dim_name, &call.comm->members()};
  if (fingerprint) {
    input.with_site = true;
    input.sequence = call.sequence;
    input.location = site.location;
  }
  auto buffers = std::make_shared<SignatureBuffers>();
  buffers->mine = make_fingerprint(input);
  buffers->all.resize(static_cast<size_t>(call.n));
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(&buffers->mine, sizeof buffers->mine, MPI_BYTE, buffers->all.data(),
                           sizeof buffers->mine, MPI_BYTE, call.comm_handle(), &request),
            "MPI_Iallgather", call.context());
  std::vector<int> others;
  for (int member : call.comm->members()) {
    if (member != call.rank) others.push_back(member);
  }
  RollCall roll(
      std::move(others),
      [&](const Activity::Snapshot& a) {
        return a.kind == Activity::Kind::Collective && a.comm == call.comm->number() &&
               a.sequence == call.sequence;
      },
      [&] { return fmt::format("{} at {}", call.describe(), site_text(site.location)); },
      fmt::format(" in {}", Activity::kSignatureExchange), "made this call");
  wait_polled(
      request, "MPI_Iallgather", buffers, [&] { return exited_member(call, site); }, roll);
  check_fingerprints(call.what, buffers->all, call.comm->members(), fingerprint, internal);
}

Call prepare_call(Communicator& comm, const LocalTensor& x, const CollectiveOptions& options,
                  const CallSite& site, int rank) {
  const CollectiveKind kind = kind_of(options);
  auto* mpi_comm = dynamic_cast<MpiCommunicator*>(&comm);
  SPMD_CHECK(mpi_comm != nullptr);
  Call call{mpi_comm, CollectiveCall{kind, site.dim_name, &mpi_comm->members()},
            Tensor{}, MPI_DATATYPE_NULL,
            0,        mpi_comm->index(),
            rank,     0};
  if (mpi_comm->comm() == MPI_COMM_NULL) {
    throw_error<CommError>("{}: rank {} is not in the mesh of dim '{}'", kind, rank, site.dim_name);
  }
  if (x.num_shards() != 1 || x.ranks()[0] != rank) {
    throw_error<CommError>(
        "{}: the mpi backend runs one rank per process; this process holds rank {} but the "
        "input holds ranks {}",
        call.describe(), rank, x.ranks());
  }
  check_usable(call.describe());
  call.input = x.shards()[0].contiguous();
  call.type = mpi_type(call.input.dtype());
  call.n = static_cast<int>(mpi_comm->members().size());
  call.site = &site;
  // Note [Point-to-point]: only two ranks of the group make a transfer, so it takes no number.
  call.sequence = is_point_to_point(kind) ? 0 : mpi_comm->next_call();
  return call;
}

}  // namespace spmd::mpi
