// spmd/backends/threads/backend.cpp: the hub (rendezvous, rank states, deadlock detection), the
// comparison of the members' calls and its reports, and the threads backend's collectives.
#include <spmd/backends/threads/backend.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <optional>
#include <source_location>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>

#include <fmt/ranges.h>

#include <spmd/collectives/group_math.h>
#include <spmd/collectives/p2p.h>
#include <spmd/collectives/validate.h>
#include <spmd/core/check.h>
#include <spmd/core/hash.h>
#include <spmd/ops/autograd.h>

namespace spmd {
namespace {

// One rank's call at a rendezvous. The input is dropped once the result is computed; shape and
// dtype stay for reports.
struct Call {
  int rank = 0;
  CollectiveKind kind = CollectiveKind::AllReduce;
  std::string dim_name;
  Tensor input;
  Shape shape;
  DType dtype = DType::F32;
  CollectiveOptions options;
  std::source_location location;
  // A send's envelope, or what a recv expects (Note [Point-to-point]).
  std::optional<P2PEnvelope> envelope;

  // "all_reduce over 'dp' [4, 8] f32 op=sum at divergence.cpp:41"
  std::string text() const {
    if (envelope) return envelope_text(*envelope, kind == CollectiveKind::Send);
    const std::string detail = describe(options);
    return fmt::format("{} over '{}' {} {}{}{} at {}", kind, dim_name, shape_str(shape), dtype,
                       detail.empty() ? "" : " ", detail, site_text(location));
  }
};

enum class Status { Pending, Computing, Done, Failed };
enum class Failure { None, Mismatch, Deadlock, Timeout, Raised };

struct Rendezvous {
  std::shared_ptr<ThreadsFamily> family;
  int64_t group = 0;
  uint64_t sequence = 0;
  // A point-to-point transfer: members are [sender, receiver], `sequence` the message's number
  // between them (Note [Point-to-point]); `requires_grad`: the sender's data carries a gradient.
  bool p2p = false;
  bool requires_grad = false;
  // A failed pairing: what was sent and what the recv expected, for the receiver's report.
  std::optional<P2PEnvelope> p2p_sent;
  std::optional<P2PEnvelope> p2p_expected;
  std::vector<int> members;  // group order
  std::vector<std::optional<Call>> calls;
  size_t arrived = 0;
  Status status = Status::Pending;
  Failure failure = Failure::None;
  std::string error;            // Mismatch, Deadlock, Timeout
  std::exception_ptr raised;    // Raised: what computing the result threw
  std::vector<Tensor> outputs;  // Done: by group index
  std::condition_variable settled;

  // "call #3 of group ranks [0, 1, 2, 3]"
  std::string where() const {
    if (p2p) {
      return fmt::format("message #{} from rank {} to rank {}", sequence, members[0], members[1]);
    }
    return fmt::format("call #{} of group ranks {}", sequence, members);
  }
  // "call #3 of group ranks [0, 1, 2, 3] over mesh dim 'x'"
  std::string what() const {
    if (p2p) return where();
    std::string dim;
    for (const auto& c : calls) {
      if (c) {
        dim = c->dim_name;
        break;
      }
    }
    return fmt::format("call #{} of group ranks {} over mesh dim '{}'", sequence, members, dim);
  }
  std::vector<int> missing() const {
    std::vector<int> out;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (!calls[i]) out.push_back(members[i]);
    }
    return out;
  }
};

// ---- comparing the members' calls (Note [Threads rendezvous]) -------------------------------

void add_unique(std::vector<std::string>& out, std::string what) {
  if (std::find(out.begin(), out.end(), what) == out.end()) out.push_back(std::move(what));
}

// How a report names an options field in which the members differ.
std::string difference_name(std::string_view field) {
  if (field == "op") return "reduce op";
  if (field == "src" || field == "dst") return fmt::format("root ({})", field);
  return std::string(field);
}

// The members' calls as the ragged collectives' checks take them (collectives/validate.h).
std::vector<MemberCall> members_of(const Rendezvous& rv) {
  std::vector<MemberCall> members;
  members.reserve(rv.calls.size());
  for (const auto& c : rv.calls) members.push_back(MemberCall{c->rank, &c->shape, &c->options});
  return members;
}

// "ranks 0,2,3 at a.cpp:10; rank 1 at a.cpp:12" when the members called from different source
// lines, else empty.
std::string site_pairing(const Rendezvous& rv) {
  std::vector<std::pair<std::string, std::vector<int>>> sites;
  for (const auto& c : rv.calls) {
    const std::string site = site_text(c->location);
    auto it =
        std::find_if(sites.begin(), sites.end(), [&](const auto& s) { return s.first == site; });
    if (it == sites.end()) {
      sites.push_back({site, {c->rank}});
    } else {
      it->second.push_back(c->rank);
    }
  }
  if (sites.size() < 2) return "";
  std::string out;
  for (const auto& [site, ranks] : sites) {
    out += fmt::format("{}{} at {}", out.empty() ? "" : "; ", ranks_text(ranks), site);
  }
  return out;
}

// The report of a complete rendezvous whose calls differ, or nullopt when they agree.
// `internal`: the debug checks' own collectives, which must also come from one line.
std::optional<std::string> mismatch_report(const Rendezvous& rv, bool internal) {
  const Call& first = *rv.calls[0];
  // Note [Ragged collectives]: the members' inputs may differ in dim 0.
  const bool ragged =
      is_ragged(first.kind) && std::all_of(rv.calls.begin(), rv.calls.end(),
                                           [&](const auto& c) { return c->kind == first.kind; });
  std::vector<std::string> differ;
  for (const auto& c : rv.calls) {
    if (c->kind != first.kind) add_unique(differ, "op");
    if (c->dtype != first.dtype) add_unique(differ, "dtype");
    bool same_shape = c->shape.size() == first.shape.size();
    for (size_t d = ragged ? 1 : 0; same_shape && d < first.shape.size(); ++d) {
      same_shape = c->shape[d] == first.shape[d];
    }
    if (!same_shape) add_unique(differ, "shape");
    // Per-rank values differ by design; ragged_mismatch checks that they fit together.
    for (std::string_view field : shared_field_differences(first.options, c->options)) {
      add_unique(differ, difference_name(field));
    }
  }
  const bool other_lines = !site_pairing(rv).empty();
  if (internal && other_lines) add_unique(differ, "source line");
  std::vector<std::string> ragged_lines;
  if (ragged && differ.empty()) {
    if (std::optional<RaggedMismatch> m = ragged_mismatch(members_of(rv))) {
      differ.push_back(std::move(m->what));
      ragged_lines = std::move(m->lines);
    }
  }
  if (differ.empty()) return std::nullopt;
  std::string report =
      fmt::format("{}: the ranks issued different collectives (they differ in {}):", rv.what(),
                  fmt::join(differ, ", "));
  for (const auto& c : rv.calls) report += fmt::format("\n  rank {}: {}", c->rank, c->text());
  for (const std::string& line : ragged_lines) report += "\n  " + line;
  if (const std::string sites = site_pairing(rv); !sites.empty()) {
    report += fmt::format("\nthe calls come from different source lines: {}", sites);
  }
  if (internal && other_lines) {
    report +=
        "\nthese are the debug checks' own gathers of the DTensor ops at those lines: the ranks "
        "are at different DTensor ops (a rank skipped or added a call before this point)";
  }
  return report;
}

// ---- the work handle ------------------------------------------------------------------------

class ThreadsWork final : public Work {
 public:
  ThreadsWork(std::shared_ptr<ThreadsHub> hub, std::shared_ptr<Rendezvous> rv, int index, int rank)
      : hub_(std::move(hub)), rv_(std::move(rv)), index_(index), rank_(rank) {}

  void wait() override;
  bool is_completed() const override;
  const LocalTensor& result() const override {
    if (!done_) throw_error<Error>("Work::result: the collective has not completed; wait() first");
    return result_;
  }
  LocalTensor take_result() override {
    if (!done_) throw_error<Error>("Work::result: the collective has not completed; wait() first");
    return std::move(result_);
  }

 private:
  std::shared_ptr<ThreadsHub> hub_;
  std::shared_ptr<Rendezvous> rv_;
  int index_;
  int rank_;
  bool done_ = false;
  LocalTensor result_;
};

}  // namespace

struct ThreadsFamily {
  ThreadsFamily(GroupFamily f, bool internal_calls)
      : family(std::move(f)),
        internal(internal_calls),
        groups(static_cast<size_t>(family.num_groups())) {}

  struct Group {
    std::map<uint64_t, std::shared_ptr<Rendezvous>> pending;  // by sequence number
    std::string first_site_pairing;  // the first call that paired different source lines
  };
  // The point-to-point transfers from one rank to another (Note [Point-to-point]).
  struct Pair {
    uint64_t sends = 0;
    uint64_t recvs = 0;
    std::map<uint64_t, std::shared_ptr<Rendezvous>> pending;  // by message number
  };
  GroupFamily family;
  std::map<std::pair<int, int>, Pair> pairs;  // by (sender, receiver)
  // The debug checks' own collectives (Communicator::is_internal): they meet only from the same
  // line.
  bool internal;
  std::vector<Group> groups;
};

// ---- the hub --------------------------------------------------------------------------------

struct ThreadsHub::Impl {
  struct RankState {
    enum class Phase { Running, Waiting, Finished };
    Phase phase = Phase::Running;
    std::shared_ptr<Rendezvous> waiting_on;  // while Waiting
    std::string how;                         // once Finished
    std::string last_call;                   // "<call text> (call #2 of group ranks [0, 1])"
  };
  struct FamilyKey {
    GroupFamily family;
    CommOptions options;
    bool operator==(const FamilyKey&) const = default;
  };
  struct FamilyKeyHash {
    std::size_t operator()(const FamilyKey& key) const {
      std::size_t seed = key.family.hash();
      hash_combine(seed, key.options.hash());
      return seed;
    }
  };

  Impl(int world_size, double timeout_s)
      : ranks_(static_cast<size_t>(world_size)), timeout_s_(timeout_s) {}

  std::shared_ptr<ThreadsFamily> family(const GroupFamily& family, const CommOptions& options);
  std::shared_ptr<Rendezvous> arrive(const std::shared_ptr<ThreadsFamily>& family, int64_t group,
                                     int index, uint64_t sequence, Call call);
  // A send (from `src` to `dst`) or a recv (at `dst` from `src`): the next one between them.
  std::shared_ptr<Rendezvous> arrive_p2p(const std::shared_ptr<ThreadsFamily>& family, int src,
                                         int dst, Call call);
  Tensor await(const std::shared_ptr<Rendezvous>& rv, int index, int rank);
  bool settled(const Rendezvous& rv);
  void finished(int rank, const std::string& how);
  void close();
  std::string describe();
  bool timed_out();

 private:
  void fail(Rendezvous& rv, Failure failure, std::string error);
  void fail_if_doomed(Rendezvous& rv);
  void check_deadlock();
  void time_out(int rank, Rendezvous& rv);
  template <class Fn>
  void for_each_pending(Fn&& fn);
  std::string rank_states() const;
  static std::string last_call_text(const RankState& state);
  std::string pairing_note(const Rendezvous& rv) const;
  static void compute(Rendezvous& rv);
  static void settle(Rendezvous& rv);
  std::string late_p2p_report(const Rendezvous& rv, std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::unordered_map<FamilyKey, std::shared_ptr<ThreadsFamily>, FamilyKeyHash> families_;
  std::vector<RankState> ranks_;
  const double timeout_s_;
  bool timed_out_ = false;
};

std::shared_ptr<ThreadsFamily> ThreadsHub::Impl::family(const GroupFamily& family,
                                                        const CommOptions& options) {
  std::lock_guard lock(mutex_);
  auto& slot = families_[FamilyKey{family, options}];
  if (!slot) {
    slot = std::make_shared<ThreadsFamily>(family, options == internal_comm_options());
  }
  return slot;
}

std::shared_ptr<Rendezvous> ThreadsHub::Impl::arrive(const std::shared_ptr<ThreadsFamily>& family,
                                                     int64_t group, int index, uint64_t sequence,
                                                     Call call) {
  std::unique_lock lock(mutex_);
  ThreadsFamily::Group& g = family->groups[static_cast<size_t>(group)];
  std::shared_ptr<Rendezvous>& slot = g.pending[sequence];
  if (!slot) {
    slot = std::make_shared<Rendezvous>();
    slot->family = family;
    slot->group = group;
    slot->sequence = sequence;
    slot->members = family->family.groups()[static_cast<size_t>(group)];
    slot->calls.resize(slot->members.size());
  }
  std::shared_ptr<Rendezvous> rv = slot;
  const int rank = call.rank;
  ranks_[static_cast<size_t>(rank)].last_call = fmt::format("{} ({})", call.text(), rv->where());
  SPMD_CHECK_MSG(!rv->calls[static_cast<size_t>(index)], "rank {} arrived twice at {}", rank,
                 rv->what());
  rv->calls[static_cast<size_t>(index)] = std::move(call);
  ++rv->arrived;
  const bool complete = rv->arrived == rv->members.size();
  if (complete) g.pending.erase(sequence);
  if (rv->status != Status::Pending) return rv;  // a late arrival at a failed rendezvous
  if (!complete) {
    fail_if_doomed(*rv);
    return rv;
  }
  if (auto report = mismatch_report(*rv, rv->family->internal)) {
    fail(*rv, Failure::Mismatch, *report + pairing_note(*rv));
    return rv;
  }
  if (g.first_site_pairing.empty()) {
    if (std::string pairing = site_pairing(*rv); !pairing.empty()) {
      g.first_site_pairing = fmt::format("call #{} ({})", sequence, pairing);
    }
  }
  // Computed outside the lock: other groups go on meanwhile. Nobody else touches the calls or
  // the outputs until the status says Done.
  rv->status = Status::Computing;
  lock.unlock();
  compute(*rv);
  lock.lock();
  settle(*rv);
  return rv;
}

std::shared_ptr<Rendezvous> ThreadsHub::Impl::arrive_p2p(
    const std::shared_ptr<ThreadsFamily>& family, int src, int dst, Call call) {
  std::unique_lock lock(mutex_);
  ThreadsFamily::Pair& pair = family->pairs[{src, dst}];
  const bool sending = call.kind == CollectiveKind::Send;
  const uint64_t number = sending ? pair.sends++ : pair.recvs++;
  std::shared_ptr<Rendezvous>& slot = pair.pending[number];
  if (!slot) {
    slot = std::make_shared<Rendezvous>();
    slot->family = family;
    slot->sequence = number;
    slot->p2p = true;
    slot->members = {src, dst};
    slot->calls.resize(2);
  }
  std::shared_ptr<Rendezvous> rv = slot;
  const int rank = call.rank;
  ranks_[static_cast<size_t>(rank)].last_call = fmt::format("{} ({})", call.text(), rv->where());
  const size_t index = sending ? 0 : 1;
  rv->calls[index] = std::move(call);
  ++rv->arrived;
  const bool complete = rv->arrived == 2;
  if (complete) pair.pending.erase(number);
  if (rv->status != Status::Pending) return rv;
  if (!complete) {
    fail_if_doomed(*rv);
    return rv;
  }
  const P2PEnvelope& sent = *rv->calls[0]->envelope;
  const P2PEnvelope& expected = *rv->calls[1]->envelope;
  if (const std::string differences = envelope_differences(sent, expected); !differences.empty()) {
    std::vector<P2PEnvelope> later;
    for (const auto& [n, other] : pair.pending) {
      if (n > number && other->calls[0]) later.push_back(*other->calls[0]->envelope);
    }
    rv->p2p_sent = sent;
    rv->p2p_expected = expected;
    fail(*rv, Failure::Mismatch, p2p_mismatch_report(sent, expected, differences, later));
    return rv;
  }
  rv->requires_grad = sent.requires_grad != 0;
  // A copy, under the lock (it shares the sender's buffer).
  compute(*rv);
  settle(*rv);
  return rv;
}

// After compute, under the lock: the inputs dropped, the outcome published to the members.
void ThreadsHub::Impl::settle(Rendezvous& rv) {
  for (auto& c : rv.calls) c->input = Tensor();
  if (rv.raised) {
    rv.status = Status::Failed;
    rv.failure = Failure::Raised;
  } else {
    rv.status = Status::Done;
  }
  rv.settled.notify_all();
}

void ThreadsHub::Impl::compute(Rendezvous& rv) {
  try {
    const Call& first = *rv.calls[0];
    GroupView view{CollectiveCall{first.kind, first.dim_name, &rv.members}, {}, {}};
    rv.outputs.resize(rv.members.size());
    for (size_t i = 0; i < rv.members.size(); ++i) {
      view.inputs.push_back(&rv.calls[i]->input);
      view.outputs.push_back(&rv.outputs[i]);
    }
    if (is_ragged(first.kind)) {
      // Each member passed its own per-rank values (Note [Ragged collectives]).
      compute_group(view, merge_ragged(members_of(rv)));
    } else {
      compute_group(view, first.options);
    }
  } catch (...) {
    rv.raised = std::current_exception();
  }
}

Tensor ThreadsHub::Impl::await(const std::shared_ptr<Rendezvous>& rv, int index, int rank) {
  std::unique_lock lock(mutex_);
  if (rv->status == Status::Pending || rv->status == Status::Computing) {
    RankState& state = ranks_[static_cast<size_t>(rank)];
    state.phase = RankState::Phase::Waiting;
    state.waiting_on = rv;
    check_deadlock();
    // Capped so the deadline cannot overflow the clock (a billion seconds is forever here).
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(std::min(timeout_s_, 1e9)));
    auto settled = [&] { return rv->status == Status::Done || rv->status == Status::Failed; };
    while (!rv->settled.wait_until(lock, deadline, settled)) {
      // Note [Threads timeout]: only a rendezvous that still lacks a member; one whose result
      // is being computed completes.
      if (rv->status == Status::Pending) time_out(rank, *rv);
    }
    state.phase = RankState::Phase::Running;
    state.waiting_on.reset();
  }
  switch (rv->failure) {
    case Failure::None:
      return std::move(rv->outputs[static_cast<size_t>(index)]);
    case Failure::Mismatch:
      if (rv->p2p && index == 1) throw CollectiveMismatchError(late_p2p_report(*rv, lock));
      throw CollectiveMismatchError(rv->error);
    case Failure::Deadlock:
      throw DeadlockError(rv->error);
    case Failure::Timeout:
      throw TimeoutError(rv->error);
    case Failure::Raised:
      std::rethrow_exception(rv->raised);
  }
  throw_error<InternalError>("threads backend: unknown rendezvous state");
}

// The receiver's report of a failed pairing. The sender may not have posted the message that
// would have fitted yet when the pair met (an isend right after): give it 200 ms, so the report
// can say the two sides pair in different orders (Megatron-LM #5271).
std::string ThreadsHub::Impl::late_p2p_report(const Rendezvous& rv,
                                              std::unique_lock<std::mutex>& lock) {
  const P2PEnvelope& sent = *rv.p2p_sent;
  const P2PEnvelope& expected = *rv.p2p_expected;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  std::vector<P2PEnvelope> later;
  for (;;) {
    later.clear();
    bool fits = false;
    const auto it = rv.family->pairs.find({rv.members[0], rv.members[1]});
    if (it != rv.family->pairs.end()) {
      for (const auto& [n, other] : it->second.pending) {
        if (n <= rv.sequence || !other->calls[0]) continue;
        later.push_back(*other->calls[0]->envelope);
        fits = fits || envelope_differences(later.back(), expected).empty();
      }
    }
    if (fits || std::chrono::steady_clock::now() >= until) break;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lock.lock();
  }
  return p2p_mismatch_report(sent, expected, envelope_differences(sent, expected), later);
}

bool ThreadsHub::Impl::settled(const Rendezvous& rv) {
  std::lock_guard lock(mutex_);
  return rv.status == Status::Done || rv.status == Status::Failed;
}

void ThreadsHub::Impl::fail(Rendezvous& rv, Failure failure, std::string error) {
  rv.status = Status::Failed;
  rv.failure = failure;
  rv.error = std::move(error);
  rv.settled.notify_all();
}

template <class Fn>
void ThreadsHub::Impl::for_each_pending(Fn&& fn) {
  for (auto& [key, family] : families_) {
    for (ThreadsFamily::Group& g : family->groups) {
      for (auto& [sequence, rv] : g.pending) {
        if (rv->status == Status::Pending) fn(*rv);
      }
    }
    for (auto& [ranks, pair] : family->pairs) {
      for (auto& [number, rv] : pair.pending) {
        if (rv->status == Status::Pending) fn(*rv);
      }
    }
  }
}

// Note [Threads deadlock detection], first case. Decided once every member that has not arrived
// has finished, so the report lists every call the group will ever see.
void ThreadsHub::Impl::fail_if_doomed(Rendezvous& rv) {
  const std::vector<int> missing = rv.missing();
  if (missing.empty()) return;
  std::string why;
  for (int member : missing) {
    const RankState& state = ranks_[static_cast<size_t>(member)];
    if (state.phase != RankState::Phase::Finished) return;
    why += fmt::format("{}rank {} has finished ({}) without making it", why.empty() ? "" : "; ",
                       member, state.how);
  }
  std::string report = fmt::format("{} can never complete: {}", rv.what(), why);
  for (size_t i = 0; i < rv.members.size(); ++i) {
    if (rv.calls[i]) {
      report += fmt::format("\n  rank {}: {}", rv.members[i], rv.calls[i]->text());
    } else {
      const RankState& state = ranks_[static_cast<size_t>(rv.members[i])];
      report += fmt::format("\n  rank {}: finished ({}); {}", rv.members[i], state.how,
                            last_call_text(state));
    }
  }
  fail(rv, Failure::Deadlock, report + pairing_note(rv));
}

// Note [Threads deadlock detection], second case.
void ThreadsHub::Impl::check_deadlock() {
  bool any_live = false;
  for (const RankState& r : ranks_) {
    if (r.phase == RankState::Phase::Finished) continue;
    any_live = true;
    if (r.phase != RankState::Phase::Waiting || r.waiting_on->status != Status::Pending) return;
  }
  if (!any_live) return;
  std::string notes;
  for (const RankState& r : ranks_) {
    if (r.phase != RankState::Phase::Waiting) continue;
    const std::string note = pairing_note(*r.waiting_on);
    if (notes.find(note) == std::string::npos) notes += note;
  }
  const std::string report = fmt::format(
      "deadlock: every rank that has not finished waits in a collective that lacks a rank, so "
      "none can complete\n{}{}",
      rank_states(), notes);
  std::vector<Rendezvous*> stuck;
  for_each_pending([&](Rendezvous& rv) { stuck.push_back(&rv); });
  for (Rendezvous* rv : stuck) fail(*rv, Failure::Deadlock, report);
}

// Note [Threads timeout].
void ThreadsHub::Impl::time_out(int rank, Rendezvous& rv) {
  const auto me = std::find(rv.members.begin(), rv.members.end(), rank);
  const Call& call = *rv.calls[static_cast<size_t>(me - rv.members.begin())];
  std::vector<std::string> lacking;
  for (int member : rv.missing()) {
    const RankState& state = ranks_[static_cast<size_t>(member)];
    lacking.push_back(fmt::format("rank {} ({})", member,
                                  state.phase == RankState::Phase::Running
                                      ? "running: it has not reached this call"
                                      : "waiting in another collective"));
  }
  const std::string report = fmt::format(
      "{} ({}): rank {} has waited {} s (--spmd-timeout={}) and the call still lacks {}\n{}{}",
      call.text(), rv.where(), rank, timeout_s_, timeout_s_, fmt::join(lacking, ", "),
      rank_states(), pairing_note(rv));
  timed_out_ = true;
  std::vector<Rendezvous*> stuck;
  for_each_pending([&](Rendezvous& r) { stuck.push_back(&r); });
  for (Rendezvous* r : stuck) fail(*r, Failure::Timeout, report);
}

std::string ThreadsHub::Impl::describe() {
  std::lock_guard lock(mutex_);
  return rank_states();
}

bool ThreadsHub::Impl::timed_out() {
  std::lock_guard lock(mutex_);
  return timed_out_;
}

std::string ThreadsHub::Impl::rank_states() const {
  std::string out = "rank states:";
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const RankState& state = ranks_[r];
    const std::string last = last_call_text(state);
    switch (state.phase) {
      case RankState::Phase::Running:
        out += fmt::format("\n  rank {}: running; {}", r, last);
        break;
      case RankState::Phase::Finished:
        out += fmt::format("\n  rank {}: finished ({}); {}", r, state.how, last);
        break;
      case RankState::Phase::Waiting: {
        const Rendezvous& rv = *state.waiting_on;
        const auto it = std::find(rv.members.begin(), rv.members.end(), static_cast<int>(r));
        const auto& call = rv.calls[static_cast<size_t>(it - rv.members.begin())];
        const std::vector<int> missing = rv.missing();
        out +=
            fmt::format("\n  rank {}: waits in {} ({})", r, call ? call->text() : "?", rv.where());
        if (rv.status == Status::Pending && !missing.empty()) {
          out += fmt::format(", which lacks {}", ranks_text(missing));
        }
        break;
      }
    }
  }
  return out;
}

std::string ThreadsHub::Impl::last_call_text(const RankState& state) {
  if (state.last_call.empty()) return "it made no collective call";
  return fmt::format("its last collective: {}", state.last_call);
}

std::string ThreadsHub::Impl::pairing_note(const Rendezvous& rv) const {
  if (rv.p2p) return "";
  const std::string& pairing = rv.family->groups[static_cast<size_t>(rv.group)].first_site_pairing;
  if (pairing.empty()) return "";
  return fmt::format(
      "\nnote: on this group, {} matched calls from different source lines; if that was not "
      "meant, a rank skipped or added a collective before it",
      pairing);
}

void ThreadsHub::Impl::finished(int rank, const std::string& how) {
  std::lock_guard lock(mutex_);
  RankState& state = ranks_[static_cast<size_t>(rank)];
  state.phase = RankState::Phase::Finished;
  state.how = how;
  std::vector<Rendezvous*> lacking;
  for_each_pending([&](Rendezvous& rv) {
    const auto it = std::find(rv.members.begin(), rv.members.end(), rank);
    if (it != rv.members.end() && !rv.calls[static_cast<size_t>(it - rv.members.begin())]) {
      lacking.push_back(&rv);
    }
  });
  for (Rendezvous* rv : lacking) fail_if_doomed(*rv);
  check_deadlock();
}

void ThreadsHub::Impl::close() {
  std::lock_guard lock(mutex_);
  std::vector<Rendezvous*> open;
  for_each_pending([&](Rendezvous& rv) { open.push_back(&rv); });
  for (Rendezvous* rv : open) {
    fail(*rv, Failure::Deadlock,
         fmt::format("{} was still incomplete when the run ended", rv->what()));
  }
  for (auto& [key, family] : families_) {
    for (ThreadsFamily::Group& g : family->groups) g.pending.clear();
    family->pairs.clear();
  }
  families_.clear();
}

ThreadsHub::ThreadsHub(int world_size, double timeout_s)
    : impl_(std::make_unique<Impl>(world_size, timeout_s)) {}
ThreadsHub::~ThreadsHub() = default;

void ThreadsHub::rank_finished(int rank, const std::string& how) {
  impl_->finished(rank, how);
}

void ThreadsHub::close() {
  impl_->close();
}

std::string ThreadsHub::describe() {
  return impl_->describe();
}

bool ThreadsHub::timed_out() {
  return impl_->timed_out();
}

// ---- work, communicators, backend -----------------------------------------------------------

namespace {

void ThreadsWork::wait() {
  if (done_) return;
  Tensor t = hub_->impl().await(rv_, index_, rank_);
  result_ = LocalTensor(std::vector<int>{rank_}, std::vector<Tensor>{std::move(t)});
  // Note [Point-to-point]: what arrives carries a gradient back when the sender's required grad.
  if (rv_->p2p && index_ == 1 && rv_->requires_grad && is_floating(result_.dtype())) {
    result_.requires_grad_(true);
  }
  done_ = true;
  rv_.reset();
}

bool ThreadsWork::is_completed() const {
  return done_ || hub_->impl().settled(*rv_);
}

}  // namespace

ThreadsCommunicator::ThreadsCommunicator(GroupFamily family, CommOptions options,
                                         std::shared_ptr<ThreadsChannel> channel)
    : Communicator(std::move(family), std::move(options)), channel_(std::move(channel)) {}

std::size_t ThreadsBackend::KeyHash::operator()(const Key& key) const {
  std::size_t seed = key.family.hash();
  hash_combine(seed, key.options.hash());
  return seed;
}

ThreadsBackend::ThreadsBackend(std::shared_ptr<ThreadsHub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank) {}

std::shared_ptr<Communicator> ThreadsBackend::make_communicator(const GroupFamily& family,
                                                                const CommOptions& options) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<ThreadsChannel>& channel = channels_[Key{family, options}];
  if (!channel) {
    channel = std::make_shared<ThreadsChannel>();
    channel->shared = hub_->impl().family(family, options);
    if (auto where = family.locate(rank_)) {
      channel->group = where->group;
      channel->index = static_cast<int>(where->index);
    }
  }
  return std::make_shared<ThreadsCommunicator>(family, options, channel);
}

WorkPtr ThreadsBackend::issue(Communicator& comm, const LocalTensor& x,
                              const CollectiveOptions& options, const CallSite& site) {
  const CollectiveKind kind = kind_of(options);
  auto* c = dynamic_cast<ThreadsCommunicator*>(&comm);
  SPMD_CHECK(c != nullptr);
  if (c->group() < 0) {
    throw_error<CommError>("{}: rank {} is not in the mesh of dim '{}'", kind, rank_,
                           site.dim_name);
  }
  if (x.num_shards() != 1 || x.ranks()[0] != rank_) {
    throw_error<CommError>(
        "{} over mesh dim '{}': the threads backend runs one rank per thread; this thread holds "
        "rank {} but the input holds ranks {}",
        kind, site.dim_name, rank_, x.ranks());
  }
  const Tensor& input = x.shards()[0];
  Call call{rank_,         kind,    site.dim_name, input,       input.shape(),
            input.dtype(), options, site.location, std::nullopt};
  if (is_point_to_point(kind)) {
    // Note [Point-to-point]: a rendezvous of the sender and the receiver.
    const bool sending = kind == CollectiveKind::Send;
    const int peer =
        sending ? std::get<SendOptions>(options).peer : std::get<RecvOptions>(options).peer;
    const int64_t tag =
        sending ? std::get<SendOptions>(options).tag : std::get<RecvOptions>(options).tag;
    const std::vector<int>& members = c->family().groups()[static_cast<size_t>(c->group())];
    const int other = members[static_cast<size_t>(peer)];
    const int src = sending ? rank_ : other;
    const int dst = sending ? other : rank_;
    call.envelope = make_envelope(EnvelopeInput{src, dst, tag, &input.shape(), input.dtype(),
                                                sending && site.requires_grad, in_backward(),
                                                site.dim_name, site.location});
    std::shared_ptr<Rendezvous> rv =
        hub_->impl().arrive_p2p(c->shared(), src, dst, std::move(call));
    return std::make_shared<ThreadsWork>(hub_, std::move(rv), sending ? 0 : 1, rank_);
  }
  std::shared_ptr<Rendezvous> rv =
      hub_->impl().arrive(c->shared(), c->group(), c->index(), c->next_call(), std::move(call));
  return std::make_shared<ThreadsWork>(hub_, std::move(rv), c->index(), rank_);
}

}  // namespace spmd
