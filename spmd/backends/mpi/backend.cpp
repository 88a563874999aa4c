// spmd/backends/mpi/backend.cpp: the mpi backend's communicators and the Backend: creating a
// communicator (a polled barrier, then MPI_Comm_split) and issuing a call.
#include <spmd/backends/mpi/backend.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <spmd/backends/mpi/call.h>
#include <spmd/backends/mpi/collectives.h>
#include <spmd/backends/mpi/exit_notice.h>
#include <spmd/backends/mpi/watchdog.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>

namespace spmd {

using namespace mpi;  // the backend's internals

// ---- communicators --------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(GroupFamily family, CommOptions options, MPI_Comm comm,
                                 int world_rank, int number)
    : Communicator(std::move(family), std::move(options)),
      comm_(comm),
      world_rank_(world_rank),
      number_(number) {
  std::vector<uint64_t>& calls = state().calls;
  if (calls.size() <= static_cast<size_t>(number)) calls.resize(static_cast<size_t>(number) + 1);
  if (auto where = this->family().locate(world_rank)) {
    group_ = where->group;
    index_ = static_cast<int>(where->index);
    members_ = this->family().group(group_);
  }
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ != MPI_COMM_NULL && mpi_alive()) MPI_Comm_free(&comm_);
}

uint64_t MpiCommunicator::next_call() {
  return state().calls[static_cast<size_t>(number_)]++;
}

MpiBackend::MpiBackend(bool fingerprint, double timeout_s) : fingerprint_(fingerprint) {
  if (!mpi_alive()) throw_error<InternalError>("MpiBackend: mpi_initialize() was not called");
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_rank(world_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(world_, &size_), "MPI_Comm_size");
  MpiState& s = state();
  if (s.notices == MPI_COMM_NULL) {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &s.notices), "MPI_Comm_dup");
  }
  s.watchdog.reset();
  s.watchdog = std::make_unique<Watchdog>(timeout_s);
}

MpiBackend::~MpiBackend() {
  if (world_ != MPI_COMM_NULL && mpi_alive()) MPI_Comm_free(&world_);
}

std::shared_ptr<Communicator> MpiBackend::make_communicator(const GroupFamily& family,
                                                            const CommOptions& options) {
  const auto where = family.locate(rank_);
  const int color = where ? static_cast<int>(where->group) : MPI_UNDEFINED;
  const int key = where ? static_cast<int>(where->index) : 0;
  const std::string what =
      fmt::format("creating the communicator of mesh dim '{}'", family.dim_name());
  check_usable(what);
  const size_t number = state().calls.size();
  MPI_Comm comm = MPI_COMM_NULL;
  {
    // Every process first meets in a polled barrier, so a process whose program has returned
    // is reported instead of leaving the others in MPI_Comm_split (Note [Exit notices]).
    ActivityScope scope(family.dim_name(), number);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibarrier(world_, &request), "MPI_Ibarrier", [&] { return what; });
    std::vector<int> others;
    for (int rank = 0; rank < size_; ++rank) {
      if (rank != rank_) others.push_back(rank);
    }
    RollCall roll(
        std::move(others),
        [&](const Activity::Snapshot& a) {
          return a.kind == Activity::Kind::Split && a.sequence == number;
        },
        [&] {
          return fmt::format(
              "creating the communicator of mesh dim '{}' (MPI_Comm_split, which takes every "
              "process)",
              family.dim_name());
        },
        "", "reached it");
    wait_polled(
        request, "MPI_Ibarrier", nullptr,
        [&] { return exited_before_split(number, family.dim_name()); }, roll);
    check_mpi(MPI_Comm_split(world_, color, key, &comm), "MPI_Comm_split", [&] {
      return fmt::format("communicator of mesh dim '{}', color {} key {}", family.dim_name(), color,
                         key);
    });
  }
  auto result =
      std::make_shared<MpiCommunicator>(family, options, comm, rank_, static_cast<int>(number));
  if (where) {
    int comm_rank = -1;
    int comm_size = -1;
    check_mpi(MPI_Comm_rank(comm, &comm_rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm, &comm_size), "MPI_Comm_size");
    SPMD_CHECK_EQ(comm_rank, key);
    SPMD_CHECK_EQ(comm_size, family.group_size());
  }
  return result;
}

WorkPtr MpiBackend::issue(Communicator& comm, const LocalTensor& x,
                          const CollectiveOptions& options, const CallSite& site) {
  const Call c = prepare_call(comm, x, options, site, rank_);
  // Note [Point-to-point]: no signature exchange (the envelope goes with the data).
  if (is_point_to_point(kind_of(options))) return run_collective(c, x, options);
  ActivityScope scope(c, site);
  exchange_signatures(c, options, site, fingerprint_);
  activity().step("the data exchange");
  return run_collective(c, x, options);
}

}  // namespace spmd
