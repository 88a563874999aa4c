// spmd/backends/mpi/backend.cpp: the mpi backend's collectives, its MPI datatypes and user ops, and
// the process's MPI lifetime.
#include <spmd/backends/mpi/backend.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include <fmt/ranges.h>

#include <spmd/collectives/blocks.h>
#include <spmd/collectives/fingerprint.h>
#include <spmd/collectives/reduce_kernels.h>
#include <spmd/collectives/trace.h>
#include <spmd/collectives/trace_export.h>
#include <spmd/collectives/validate.h>
#include <spmd/core/check.h>
#include <spmd/core/error.h>
#include <spmd/ops/ops.h>
#include <spmd/world/world.h>

namespace spmd {
namespace {

using Clock = std::chrono::steady_clock;

// ---- the process's MPI state ----------------------------------------------------------------

// What another process said when its program returned (Note [Exit notices]).
struct ExitNotice {
  std::string how;   // "returned from the program"
  std::string last;  // its last collective (format_record), or empty
  // Communicators it created, and its calls on the first calls.size() of them (a notice lists at
  // most kNoticeCommunicators; on a later one its count is unknown).
  uint64_t created = 0;
  std::vector<uint64_t> calls;
};

struct Watchdog;

struct MpiState {
  bool initialized_here = false;  // we called MPI_Init_thread, so we call MPI_Finalize
  bool finalized = false;
  int rank = -1;
  int size = 0;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  MPI_Op op_sum = MPI_OP_NULL;
  MPI_Op op_product = MPI_OP_NULL;
  MPI_Op op_min = MPI_OP_NULL;
  MPI_Op op_max = MPI_OP_NULL;

  // Note [Exit notices]: the main thread's alone.
  MPI_Comm notices = MPI_COMM_NULL;  // created with the first MpiBackend
  std::vector<uint64_t> calls;       // per communicator number: this process's calls on it
  std::map<int, ExitNotice> exited;  // notices received, by sender
  std::vector<char> notice;          // this process's, alive while its sends may be in flight
  // A polled wait failed; its request cannot be cancelled and stays pending, with its buffers.
  std::string failed;
  std::vector<std::shared_ptr<void>> parked;

  std::unique_ptr<Watchdog> watchdog;  // Note [MPI watchdog]

  // Note [Roll call]: the main thread's alone.
  uint64_t roll_calls = 0;  // roll calls this process started
  // Queries and answers sent, kept alive: their sends are never waited for.
  std::deque<std::vector<char>> sent;
};

MpiState& state() {
  static MpiState s;
  return s;
}

// True while MPI calls are allowed.
bool mpi_alive() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("error {}", code);
  return std::string(text, static_cast<size_t>(length));
}

// Throws CommError naming the MPI call, MPI's error string, this rank and what was being done.
template <class Context>
void check_mpi(int code, const char* call, Context&& context) {
  if (code == MPI_SUCCESS) return;
  throw_error<CommError>("{} failed on rank {}: {} ({})", call, state().rank,
                         mpi_error_string(code), context());
}

void check_mpi(int code, const char* call) {
  check_mpi(code, call, [] { return std::string("mpi backend"); });
}

// This process's world as reports see it (the flight recorder's dump).
World describing_world() {
  auto world = std::make_shared<WorldState>();
  world->size = state().size;
  world->held_ranks = {state().rank};
  world->backend_name = "mpi";
  return World(std::move(world));
}

// ---- datatypes and ops ----------------------------------------------------------------------

static_assert(sizeof(bool) == 1, "Bool tensors travel as MPI_UINT8_T");

DType dtype_of(MPI_Datatype type) {
  const MpiState& s = state();
  if (type == s.bf16) return DType::BF16;
  if (type == s.f16) return DType::F16;
  if (type == MPI_FLOAT) return DType::F32;
  if (type == MPI_DOUBLE) return DType::F64;
  throw_error<InternalError>("mpi backend: a user op was called on an unexpected datatype");
}

// The user ops: inout = in op inout through the shared kernel (Note [Reduction order]); the ops
// are commutative, so the operand order does not matter.
template <ReduceOp Op>
void user_op(void* in, void* inout, int* length, MPI_Datatype* type) {
  const void* inputs[2] = {inout, in};
  reduce_buffers(dtype_of(*type), Op, inputs, 2, inout, *length);
}

void create_types_and_ops() {
  MpiState& s = state();
  if (s.bf16 != MPI_DATATYPE_NULL) return;
  check_mpi(MPI_Type_contiguous(2, MPI_BYTE, &s.bf16), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&s.bf16), "MPI_Type_commit");
  check_mpi(MPI_Type_contiguous(2, MPI_BYTE, &s.f16), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&s.f16), "MPI_Type_commit");
  check_mpi(MPI_Op_create(&user_op<ReduceOp::Sum>, 1, &s.op_sum), "MPI_Op_create");
  check_mpi(MPI_Op_create(&user_op<ReduceOp::Product>, 1, &s.op_product), "MPI_Op_create");
  check_mpi(MPI_Op_create(&user_op<ReduceOp::Min>, 1, &s.op_min), "MPI_Op_create");
  check_mpi(MPI_Op_create(&user_op<ReduceOp::Max>, 1, &s.op_max), "MPI_Op_create");
}

void free_types_and_ops() {
  MpiState& s = state();
  for (MPI_Op* op : {&s.op_sum, &s.op_product, &s.op_min, &s.op_max}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
  for (MPI_Datatype* type : {&s.bf16, &s.f16}) {
    if (*type != MPI_DATATYPE_NULL) MPI_Type_free(type);
  }
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
      return state().bf16;
    case DType::F16:
      return state().f16;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::Bool:
      return MPI_UINT8_T;
  }
  throw_error<InternalError>("mpi backend: unknown dtype");
}

// The MPI op computing `op` (Avg: the sum; the caller divides) on `dtype`.
MPI_Op mpi_op(ReduceOp op, DType dtype) {
  const MpiState& s = state();
  if (op == ReduceOp::Avg) op = ReduceOp::Sum;
  if (dtype == DType::Bool) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Max:
      case ReduceOp::BOr:
        return MPI_BOR;
      case ReduceOp::Product:
      case ReduceOp::Min:
      case ReduceOp::BAnd:
        return MPI_BAND;
      default:
        return MPI_BXOR;
    }
  }
  if (is_integral(dtype)) {
    switch (op) {
      case ReduceOp::Sum:
        return MPI_SUM;
      case ReduceOp::Product:
        return MPI_PROD;
      case ReduceOp::Min:
        return MPI_MIN;
      case ReduceOp::Max:
        return MPI_MAX;
      case ReduceOp::BAnd:
        return MPI_BAND;
      case ReduceOp::BOr:
        return MPI_BOR;
      default:
        return MPI_BXOR;
    }
  }
  const bool native = dtype == DType::F32 || dtype == DType::F64;
  switch (op) {
    case ReduceOp::Sum:
      return native ? MPI_SUM : s.op_sum;
    case ReduceOp::Product:
      return native ? MPI_PROD : s.op_product;
    case ReduceOp::Min:
      return s.op_min;  // NaN propagates as in the shared kernel; MPI_MIN does not promise it
    case ReduceOp::Max:
      return s.op_max;
    default:
      // check_local rejects bitwise ops on floating dtypes before the backend runs.
      throw_error<InternalError>("mpi backend: op {} on {}", op, dtype);
  }
}

// Avg's final step, as the shared kernel does it: in the accumulation type, then rounded.
void divide_in_place(Tensor& t, int64_t n) {
  dispatch_dtype(t.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      using A =
          std::conditional_t<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>, float, T>;
      T* p = static_cast<T*>(t.data_ptr());
      for (int64_t i = 0; i < t.numel(); ++i) {
        p[i] = static_cast<T>(static_cast<A>(static_cast<A>(p[i]) / static_cast<A>(n)));
      }
    }
  });
}

// ---- one call -------------------------------------------------------------------------------

// Note [Signature exchange]
// Before its MPI call, every member allgathers a CollectiveFingerprint of what it is about to do
// (Note [Collective fingerprint] in collectives/fingerprint.h). A member whose call differs would
// otherwise make MPI hang, truncate or silently misread buffers; with the fingerprints every member
// finds the same difference and throws the same error.

struct Call {
  MpiCommunicator* comm;
  CollectiveCall what;
  Tensor input;  // this rank's input, contiguous
  MPI_Datatype type;
  int n;              // group size
  int index;          // this rank's group rank
  int rank;           // this process's rank
  uint64_t sequence;  // this call's number on the communicator

  std::string describe() const { return describe_call(what); }
  auto context() const {
    return [this] { return describe(); };
  }
  MPI_Comm comm_handle() const { return comm->comm(); }
};

// ---- the activity, read by the watchdog and by signal reports (Note [MPI watchdog]) ----------

class Activity {
 public:
  enum class Kind { Running, Collective, Split, Finishing };

  // What a roll call's answer says about this process (Note [Roll call]).
  struct Snapshot {
    Kind kind = Kind::Running;
    int comm = -1;          // Collective: the communicator's number
    uint64_t sequence = 0;  // Collective: the call's number on it; Split: the new one's number
    double waited_s = 0.0;  // how long the wait has lasted
    std::string text;       // text()
  };

  // The main thread waits in `call` (from `site`), in `step`.
  void begin(const Call& call, const CallSite& site, const char* step) {
    std::lock_guard lock(mutex_);
    kind_ = Kind::Collective;
    call_ = &call;
    site_ = &site;
    step_ = step;
    since_ = Clock::now();
  }
  // The main thread creates communicator `number`, of mesh dim `dim`.
  void begin_split(const std::string& dim, size_t number) {
    std::lock_guard lock(mutex_);
    kind_ = Kind::Split;
    split_ = dim;
    split_number_ = number;
    since_ = Clock::now();
  }
  void step(const char* step) {
    std::lock_guard lock(mutex_);
    step_ = step;
  }
  void end() {
    std::lock_guard lock(mutex_);
    kind_ = Kind::Running;
    call_ = nullptr;
    site_ = nullptr;
    last_end_ = Clock::now();
  }
  void finishing() {
    std::lock_guard lock(mutex_);
    kind_ = Kind::Finishing;
    since_ = Clock::now();
  }

  // The watchdog thread's tick (Note [Stopped processes]): a tick that comes more than
  // kStoppedGap after the last one means the whole process did not run in between.
  void heartbeat() {
    std::lock_guard lock(mutex_);
    const Clock::time_point now = Clock::now();
    if (last_beat_ != Clock::time_point{} && now - last_beat_ > kStoppedGap) {
      stopped_s_ = std::chrono::duration<double>(now - last_beat_).count();
      stopped_until_ = now;
    }
    last_beat_ = now;
  }

  // Note [MPI watchdog]: the report of a wait older than `timeout_s`, or nullopt. The polled
  // waits (the signature exchange, a communicator's creation) report themselves after a roll call
  // (Note [Roll call]); the watchdog reports them only if that has not happened kRollCallBackstop
  // later.
  std::optional<std::string> overdue(double timeout_s) const {
    std::lock_guard lock(mutex_);
    if (kind_ != Kind::Collective && kind_ != Kind::Split) return std::nullopt;
    const double age = seconds_since(since_);
    const bool polled = kind_ == Kind::Split || step_ == kSignatureExchange;
    if (age <= timeout_s + (polled ? kRollCallBackstop : 0.0)) return std::nullopt;
    if (kind_ == Kind::Split) {
      return fmt::format(
          "creating the communicator of mesh dim '{}' has waited {:.1f} s (--spmd-timeout={}): "
          "MPI_Comm_split takes every process, and one has not reached it (it runs elsewhere, "
          "waits in a collective, or is much slower); each rank's report says where it is",
          split_, age, timeout_s);
    }
    const bool exchange = step_ == kSignatureExchange;
    return fmt::format(
        "{} at {} has waited {:.1f} s (--spmd-timeout={}) in {}: {}", call_->describe(),
        site_text(), age, timeout_s, step_,
        exchange ? "a member of the group has not made this call (it runs elsewhere, waits in "
                   "another collective, or is much slower); each rank's report says where it is"
                 : "every member made the call, but the data has not arrived");
  }

  // "waiting 3.2 s in ... at train.cpp:42 (the signature exchange)", "running outside any
  // collective (the last one ended 1.5 s ago)", ..., followed by Note [Stopped processes]'s
  // remark when the process did not run for a while.
  std::string text() const {
    std::lock_guard lock(mutex_);
    return text_locked() + stopped_text_locked();
  }

  Snapshot snapshot() const {
    std::lock_guard lock(mutex_);
    Snapshot out;
    out.kind = kind_;
    if (kind_ == Kind::Collective) {
      out.comm = call_->comm->number();
      out.sequence = call_->sequence;
    } else if (kind_ == Kind::Split) {
      out.sequence = split_number_;
    }
    out.waited_s = kind_ == Kind::Running ? 0.0 : seconds_since(since_);
    out.text = text_locked() + stopped_text_locked();
    return out;
  }

  static constexpr const char* kSignatureExchange = "the signature exchange";
  // Note [Roll call]: how long after the timeout the watchdog still leaves a polled wait to
  // report itself.
  static constexpr double kRollCallBackstop = 3.0;
  static constexpr std::chrono::seconds kStoppedGap{1};

 private:
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  std::string site_text() const {
    return call_site_text(site_->location.file_name(), site_->location.line());
  }

  std::string text_locked() const {
    switch (kind_) {
      case Kind::Collective:
        return fmt::format("waiting {:.1f} s in {} at {} ({})", seconds_since(since_),
                           call_->describe(), site_text(), step_);
      case Kind::Split:
        return fmt::format(
            "waiting {:.1f} s to create the communicator of mesh dim '{}' "
            "(MPI_Comm_split, which takes every process)",
            seconds_since(since_), split_);
      case Kind::Finishing:
        return fmt::format(
            "finishing for {:.1f} s: the program returned, and the process waits for the other "
            "ranks' programs to end before MPI_Finalize",
            seconds_since(since_));
      case Kind::Running:
        break;
    }
    if (last_end_ == Clock::time_point{}) return "running, before any collective";
    return fmt::format("running outside any collective (the last one ended {:.1f} s ago)",
                       seconds_since(last_end_));
  }

  // Note [Stopped processes]: the watchdog's ticks stopped now (the report runs as soon as the
  // process goes on, maybe before the next tick), or stopped for a while before.
  std::string stopped_text_locked() const {
    if (last_beat_ == Clock::time_point{}) return "";
    const double silent = seconds_since(last_beat_);
    if (silent > std::chrono::duration<double>(kStoppedGap).count()) {
      return fmt::format(
          "; this process did not run for the last {:.1f} s (stopped, e.g. by SIGSTOP, or "
          "starved of CPU), so the times above count that pause",
          silent);
    }
    if (stopped_until_ == Clock::time_point{}) return "";
    return fmt::format(
        "; this process did not run for {:.1f} s until {:.1f} s ago (stopped, e.g. by SIGSTOP, "
        "or starved of CPU)",
        stopped_s_, seconds_since(stopped_until_));
  }

  mutable std::mutex mutex_;
  Kind kind_ = Kind::Running;
  const Call* call_ = nullptr;      // Collective: alive until end() (the main thread's)
  const CallSite* site_ = nullptr;  // Collective
  const char* step_ = "";
  std::string split_;        // Split: the mesh dim
  size_t split_number_ = 0;  // Split: the communicator's number
  Clock::time_point since_{};
  Clock::time_point last_end_{};
  Clock::time_point last_beat_{};
  double stopped_s_ = 0.0;
  Clock::time_point stopped_until_{};
};

Activity& activity() {
  static Activity a;
  return a;
}

// Ends the activity when the wait ends, however it ends.
struct ActivityScope {
  ActivityScope(const Call& call, const CallSite& site) {
    activity().begin(call, site, Activity::kSignatureExchange);
  }
  ActivityScope(const std::string& split_dim, size_t number) {
    activity().begin_split(split_dim, number);
  }
  ~ActivityScope() { activity().end(); }
  ActivityScope(const ActivityScope&) = delete;
  ActivityScope& operator=(const ActivityScope&) = delete;
};

// ---- the watchdog thread (Note [MPI watchdog]) ----------------------------------------------

constexpr std::chrono::milliseconds kWatchdogInterval{100};

// Prints the timeout, dumps the flight recorder and ends the job. Never returns.
[[noreturn]] void report_timeout(const std::string& message) {
  // This process has reported: the SIGTERM mpirun sends while the job ends must not report it
  // again (Note [Signal reports]).
  for (int sig : {SIGINT, SIGTERM}) std::signal(sig, SIG_IGN);
  const int rank = state().rank;
  fmt::print(stderr, "[rank {}] TimeoutError: {}\n", rank, message);
  std::fflush(stderr);
  dump_flight_recorder(describing_world(), "TimeoutError: " + message);
  std::fflush(nullptr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; in case it does
}

struct Watchdog {
  explicit Watchdog(double timeout) : timeout_s(timeout), thread([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }
  void run() {
    std::unique_lock lock(mutex);
    while (!wake.wait_for(lock, kWatchdogInterval, [this] { return stop; })) {
      activity().heartbeat();
      if (std::optional<std::string> message = activity().overdue(timeout_s)) {
        lock.unlock();
        report_timeout(*message);
      }
    }
  }

  double timeout_s;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;  // last: starts once the members above exist
};

// ---- exit notices (Note [Exit notices]) -----------------------------------------------------

constexpr int kExitTag = 7301;
constexpr uint32_t kNoticeMagic = 0x5350'4d44;  // "SPMD"
// Per-communicator counts a notice carries at most: the notice stays far below the eager limit
// of OpenMPI's transports (4 KB on shared memory), so its sends complete without a receiver.
constexpr size_t kNoticeCommunicators = 256;
constexpr size_t kNoticeText = 1024;

struct NoticeHeader {
  uint32_t magic;
  uint32_t created;  // communicators created
  uint32_t listed;   // counts that follow (uint64_t each)
  uint32_t how_bytes;
  uint32_t last_bytes;
};

std::vector<char> encode_notice(const std::string& how, const std::string& last) {
  const MpiState& s = state();
  const std::string h = how.substr(0, kNoticeText);
  const std::string l = last.substr(0, kNoticeText);
  NoticeHeader header{kNoticeMagic, static_cast<uint32_t>(s.calls.size()),
                      static_cast<uint32_t>(std::min(s.calls.size(), kNoticeCommunicators)),
                      static_cast<uint32_t>(h.size()), static_cast<uint32_t>(l.size())};
  std::vector<char> out(sizeof header + header.listed * sizeof(uint64_t) + h.size() + l.size());
  char* p = out.data();
  std::memcpy(p, &header, sizeof header);
  p += sizeof header;
  std::memcpy(p, s.calls.data(), header.listed * sizeof(uint64_t));
  p += header.listed * sizeof(uint64_t);
  std::memcpy(p, h.data(), h.size());
  std::memcpy(p + h.size(), l.data(), l.size());
  return out;
}

std::optional<ExitNotice> decode_notice(const std::vector<char>& bytes) {
  NoticeHeader header{};
  if (bytes.size() < sizeof header) return std::nullopt;
  std::memcpy(&header, bytes.data(), sizeof header);
  const size_t counts = header.listed * sizeof(uint64_t);
  if (header.magic != kNoticeMagic ||
      bytes.size() != sizeof header + counts + header.how_bytes + header.last_bytes) {
    return std::nullopt;
  }
  ExitNotice n;
  n.created = header.created;
  n.calls.resize(header.listed);
  const char* p = bytes.data() + sizeof header;
  std::memcpy(n.calls.data(), p, counts);
  p += counts;
  n.how.assign(p, header.how_bytes);
  n.last.assign(p + header.how_bytes, header.last_bytes);
  return n;
}

void answer_roll_calls();

// Receives every notice that has arrived, and answers every roll call (Note [Roll call]).
void read_notices() {
  MpiState& s = state();
  if (s.notices == MPI_COMM_NULL) return;
  answer_roll_calls();
  for (;;) {
    int flag = 0;
    MPI_Status status;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kExitTag, s.notices, &flag, &status), "MPI_Iprobe");
    if (!flag) return;
    int bytes = 0;
    check_mpi(MPI_Get_count(&status, MPI_BYTE, &bytes), "MPI_Get_count");
    std::vector<char> buffer(static_cast<size_t>(std::max(bytes, 0)));
    check_mpi(MPI_Recv(buffer.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kExitTag, s.notices,
                       MPI_STATUS_IGNORE),
              "MPI_Recv");
    if (std::optional<ExitNotice> notice = decode_notice(buffer)) {
      s.exited[status.MPI_SOURCE] = std::move(*notice);
    }
  }
}

// ---- the roll call (Note [Roll call]) -------------------------------------------------------

constexpr int kRollQueryTag = 7302;
constexpr int kRollAnswerTag = 7303;
constexpr uint32_t kRollMagic = 0x524f'4c4c;  // "ROLL"
// How long a roll call waits for answers: a process that polls answers within milliseconds.
constexpr std::chrono::milliseconds kRollCallGrace{1000};

struct RollQuery {
  uint32_t magic;
  uint32_t unused;
  uint64_t id;
};

struct RollAnswerHeader {
  uint32_t magic;
  int32_t kind;  // Activity::Kind
  int32_t comm;
  uint32_t text_bytes;
  uint64_t id;
  uint64_t sequence;
  double waited_s;
};

struct RollAnswer {
  Activity::Snapshot state;
  uint64_t id = 0;
};

// Sends `bytes` to `rank` on the notices communicator without waiting (small enough to go
// eagerly); the buffer stays alive in MpiState::sent.
void send_small(std::vector<char> bytes, int rank, int tag) {
  MpiState& s = state();
  s.sent.push_back(std::move(bytes));
  const std::vector<char>& buffer = s.sent.back();
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Isend(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, rank, tag, s.notices,
                &request) == MPI_SUCCESS) {
    MPI_Request_free(&request);
  }
}

// The next message with `tag` that has arrived, and its sender.
std::optional<std::pair<int, std::vector<char>>> receive_small(int tag) {
  const MpiState& s = state();
  int flag = 0;
  MPI_Status status;
  check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, tag, s.notices, &flag, &status), "MPI_Iprobe");
  if (!flag) return std::nullopt;
  int bytes = 0;
  check_mpi(MPI_Get_count(&status, MPI_BYTE, &bytes), "MPI_Get_count");
  std::vector<char> buffer(static_cast<size_t>(std::max(bytes, 0)));
  check_mpi(MPI_Recv(buffer.data(), bytes, MPI_BYTE, status.MPI_SOURCE, tag, s.notices,
                     MPI_STATUS_IGNORE),
            "MPI_Recv");
  return std::make_pair(status.MPI_SOURCE, std::move(buffer));
}

// Answers every roll call that has arrived with this process's activity.
void answer_roll_calls() {
  while (auto query = receive_small(kRollQueryTag)) {
    RollQuery q{};
    if (query->second.size() != sizeof q) continue;
    std::memcpy(&q, query->second.data(), sizeof q);
    if (q.magic != kRollMagic) continue;
    const Activity::Snapshot now = activity().snapshot();
    const std::string text = now.text.substr(0, kNoticeText);
    const RollAnswerHeader header{kRollMagic,  static_cast<int32_t>(now.kind),
                                  now.comm,    static_cast<uint32_t>(text.size()),
                                  q.id,        now.sequence,
                                  now.waited_s};
    std::vector<char> bytes(sizeof header + text.size());
    std::memcpy(bytes.data(), &header, sizeof header);
    std::memcpy(bytes.data() + sizeof header, text.data(), text.size());
    send_small(std::move(bytes), query->first, kRollAnswerTag);
  }
}

std::optional<RollAnswer> decode_answer(const std::vector<char>& bytes) {
  RollAnswerHeader header{};
  if (bytes.size() < sizeof header) return std::nullopt;
  std::memcpy(&header, bytes.data(), sizeof header);
  if (header.magic != kRollMagic || bytes.size() != sizeof header + header.text_bytes) {
    return std::nullopt;
  }
  RollAnswer out;
  out.id = header.id;
  out.state.kind = static_cast<Activity::Kind>(header.kind);
  out.state.comm = header.comm;
  out.state.sequence = header.sequence;
  out.state.waited_s = header.waited_s;
  out.state.text.assign(bytes.data() + sizeof header, header.text_bytes);
  return out;
}

// "3", "0-2", "0-2,5": ranks ascending.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ",", ranks[i]);
    if (j > i) out += fmt::format("-{}", ranks[j]);
    i = j + 1;
  }
  return out;
}

// Note [Roll call]
// A wait that only polls (the signature exchange, the barrier before a communicator split) can
// say who has not arrived when it times out: this process asks every rank it waits for where it
// is (a small message on the notices communicator, Note [Exit notices]), and every process that is
// itself in a polled wait answers within milliseconds with its activity: the same call (it has
// arrived, and has waited so long), another one (which, where), or finishing. A rank that does not
// answer within kRollCallGrace has not arrived: it is stopped (SIGSTOP), busy outside any
// collective, or blocked in an MPI call that is not polled (the data exchange of another
// collective). The TimeoutError then names the ranks that did not arrive, where the others are
// and how long each has waited, instead of "a member has not made this call"; it is printed
// about kRollCallGrace after the timeout (the watchdog reports a polled wait itself only
// Activity::kRollCallBackstop after it, should the roll call never end).
class RollCall {
 public:
  // What the wait is: `members` the world ranks it needs (this process's excluded), `here` says
  // whether an answer shows the rank in this same wait; the report reads "{what} has waited 2.0 s
  // (--spmd-timeout=2){step}: rank 3 has not {absent}: ...".
  RollCall(std::vector<int> members, std::function<bool(const Activity::Snapshot&)> here,
           std::function<std::string()> what, std::string step, std::string absent)
      : members_(std::move(members)),
        here_(std::move(here)),
        what_(std::move(what)),
        step_(std::move(step)),
        absent_(std::move(absent)) {}

  // Polls the roll call for a wait that began at `start`: starts it once the wait is older than
  // the timeout, collects the answers, and reports (never returning) when all are in or the
  // grace has passed.
  void poll(Clock::time_point start, Clock::time_point now) {
    MpiState& s = state();
    const double timeout_s = s.watchdog ? s.watchdog->timeout_s : kDefaultTimeoutSeconds;
    if (!started_) {
      if (std::chrono::duration<double>(now - start).count() <= timeout_s) return;
      started_ = true;
      asked_at_ = now;
      asked_waited_s_ = std::chrono::duration<double>(now - start).count();
      id_ = ++s.roll_calls;
      const RollQuery query{kRollMagic, 0, id_};
      for (int rank : members_) {
        std::vector<char> bytes(sizeof query);
        std::memcpy(bytes.data(), &query, sizeof query);
        send_small(std::move(bytes), rank, kRollQueryTag);
      }
    }
    while (auto message = receive_small(kRollAnswerTag)) {
      std::optional<RollAnswer> answer = decode_answer(message->second);
      if (!answer || answer->id != id_) continue;  // a late answer to an earlier roll call
      answers_[message->first] = std::move(answer->state);
    }
    if (answers_.size() < members_.size() && now - asked_at_ < kRollCallGrace) return;
    report_timeout(report(std::chrono::duration<double>(now - start).count(), timeout_s));
  }

 private:
  std::string report(double waited_s, double timeout_s) const {
    const MpiState& s = state();
    std::vector<int> missing;
    std::vector<std::string> elsewhere;
    std::vector<std::string> here = {
        fmt::format("rank {} (this one) for {:.1f} s", s.rank, asked_waited_s_)};
    for (int rank : members_) {
      const auto it = answers_.find(rank);
      if (it == answers_.end()) {
        missing.push_back(rank);
      } else if (here_(it->second)) {
        here.push_back(fmt::format("rank {} for {:.1f} s", rank, it->second.waited_s));
      } else {
        elsewhere.push_back(
            fmt::format("rank {} has not {}: it is {}", rank, absent_, it->second.text));
      }
    }
    std::string out = fmt::format("{} has waited {:.1f} s (--spmd-timeout={}){}: ", what_(),
                                  waited_s, timeout_s, step_);
    if (!missing.empty()) {
      const bool one = missing.size() == 1;
      out += fmt::format(
          "rank{} {} {} not {}: {} did not answer a roll call within {:.1f} s ({} stopped, e.g. by "
          "SIGSTOP, busy outside any collective, or blocked in another collective's data "
          "exchange; {} own report, if any, says where)",
          one ? "" : "s", rank_list(missing), one ? "has" : "have", absent_, one ? "it" : "they",
          std::chrono::duration<double>(kRollCallGrace).count(), one ? "it is" : "each is",
          one ? "its" : "each one's");
    } else if (elsewhere.empty()) {
      out += "every rank it waits for answered from this wait, yet MPI has not completed it";
    }
    for (const std::string& e : elsewhere) {
      out += fmt::format("{}{}", missing.empty() && &e == &elsewhere.front() ? "" : "; ", e);
    }
    out += fmt::format("; waiting in it when the roll call began: {}", fmt::join(here, ", "));
    return out;
  }

  std::vector<int> members_;
  std::function<bool(const Activity::Snapshot&)> here_;
  std::function<std::string()> what_;
  std::string step_;
  std::string absent_;
  bool started_ = false;
  uint64_t id_ = 0;
  Clock::time_point asked_at_{};
  double asked_waited_s_ = 0.0;
  std::map<int, Activity::Snapshot> answers_;
};

std::string last_collective_clause(const ExitNotice& n) {
  return n.last.empty() ? "it made no collective call"
                        : fmt::format("its last collective: {}", n.last);
}

// Why `call` can never complete, when a member's exit notice says it never made it.
std::optional<std::string> exited_member(const Call& call, const CallSite& site) {
  const MpiState& s = state();
  if (s.exited.empty()) return std::nullopt;
  const size_t number = static_cast<size_t>(call.comm->number());
  for (int member : call.comm->members()) {
    const auto it = s.exited.find(member);
    if (it == s.exited.end()) continue;
    const ExitNotice& n = it->second;
    uint64_t made = 0;
    if (number < n.created) {
      if (number >= n.calls.size()) continue;  // not listed: unknown, the watchdog decides
      made = n.calls[number];
    }
    if (made > call.sequence) continue;  // it made this call, and its data is on the way
    return fmt::format(
        "{} at {} can never complete: rank {} {} after {} call(s) on this communicator, without "
        "making this one (call #{}); {}",
        call.describe(), call_site_text(site.location.file_name(), site.location.line()), member,
        n.how, made, call.sequence, last_collective_clause(n));
  }
  return std::nullopt;
}

// Why the split creating communicator `number` can never complete, when a process's exit notice
// says it created fewer communicators.
std::optional<std::string> exited_before_split(size_t number, const std::string& dim) {
  for (const auto& [rank, n] : state().exited) {
    if (n.created > number) continue;
    return fmt::format(
        "creating the communicator of mesh dim '{}' (MPI_Comm_split, which takes every process) "
        "can never complete: rank {} {} after creating {} communicator(s); {}",
        dim, rank, n.how, n.created, last_collective_clause(n));
  }
  return std::nullopt;
}

// Waits for `request` without blocking in MPI (Note [Exit notices]): polls it, and reads exit
// notices while it is pending; when `doomed()` says a rank it needs is gone, the request and
// `buffers` are parked for good and the wait ends with DeadlockError. Past the timeout, `roll`
// finds out who has not arrived and reports (Note [Roll call]).
template <class Doomed>
void wait_polled(MPI_Request& request, const char* call, const std::shared_ptr<void>& buffers,
                 Doomed&& doomed, RollCall& roll) {
  int done = 0;
  check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
  if (done) return;
  const Clock::time_point start = Clock::now();
  Clock::time_point next_look = start;
  for (;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    const Clock::time_point now = Clock::now();
    if (now >= next_look) {
      read_notices();
      if (std::optional<std::string> why = doomed()) {
        MpiState& s = state();
        s.parked.push_back(buffers);
        s.failed = *why;
        throw DeadlockError(*why);
      }
      roll.poll(start, now);
      next_look = now + std::chrono::milliseconds(1);
    }
    // A peer that is not there yet: look less often, leaving the core to the ranks that work.
    if (now - start > std::chrono::milliseconds(10)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void check_usable(const std::string& what) {
  const MpiState& s = state();
  if (!s.failed.empty()) {
    throw_error<CommError>(
        "{}: the mpi backend failed earlier ({}); the job cannot continue (a collective request "
        "is still pending)",
        what, s.failed);
  }
}

int count_of(const Call& call, int64_t elements) {
  if (elements > INT_MAX) {
    throw_error<CommError>("{}: {} elements exceed MPI's int count limit ({})", call.describe(),
                           elements, INT_MAX);
  }
  return static_cast<int>(elements);
}

// The signature exchange's buffers: they must outlive a request that is given up on.
struct SignatureBuffers {
  CollectiveFingerprint mine;
  std::vector<CollectiveFingerprint> all;
};

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
      [&] {
        return fmt::format("{} at {}", call.describe(),
                           call_site_text(site.location.file_name(), site.location.line()));
      },
      fmt::format(" in {}", Activity::kSignatureExchange), "made this call");
  wait_polled(
      request, "MPI_Iallgather", buffers, [&] { return exited_member(call, site); }, roll);
  check_fingerprints(call.what, buffers->all, call.comm->members(), fingerprint, internal);
}

// The call's checks and buffers; nothing is exchanged yet.
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
  call.sequence = mpi_comm->next_call();
  return call;
}

WorkPtr done(const LocalTensor& x, Tensor result) {
  std::vector<Tensor> shards;
  shards.push_back(std::move(result));
  return std::make_shared<CompletedWork>(LocalTensor(x, std::move(shards)));
}

// Note [Rank-ordered floating reductions]
// MPI may bracket a reduction as it likes ((x0 + x1) + (x2 + x3) in a tree), and the user ops
// for BF16/F16 round at every hop. Floating Sum, Product and Avg over more than 2 ranks would then
// differ from sim in the last bits, breaking Note [Reduction order]'s promise that every backend
// gives sim's bits. So these reductions do not use MPI's reduction at all: each member receives
// its slice of every member's input (MPI_Alltoall[v], the traffic of a reduce-scatter) and folds
// the slices in ascending group rank with the shared kernel; all_reduce and reduce then
// (all)gather the reduced slices. Min, Max, integers, Bool and groups of 1 or 2 (a single
// commutative step) keep MPI's own reduction.
bool needs_rank_order(DType dtype, ReduceOp op, int n) {
  return n > 2 && is_floating(dtype) &&
         (op == ReduceOp::Sum || op == ReduceOp::Product || op == ReduceOp::Avg);
}

// Folds the n contiguous blocks of `count` elements in `blocks` in rank order into `out`
// (Avg divides as the shared kernel does).
void fold_blocks(const Call& c, ReduceOp op, const char* blocks, int64_t count, void* out) {
  const size_t bytes = itemsize(c.input.dtype()) * static_cast<size_t>(count);
  std::vector<const void*> inputs(static_cast<size_t>(c.n));
  for (int i = 0; i < c.n; ++i) inputs[static_cast<size_t>(i)] = blocks + bytes * i;
  reduce_buffers(c.input.dtype(), op, inputs.data(), c.n, out, count);
}

// The whole input reduced in rank order, on every member (root < 0) or on group rank `root`
// only (others get an empty tensor). The flat input is split into n slices of near-equal size.
Tensor rank_ordered_reduce(const Call& c, ReduceOp op, int root) {
  const int64_t total = c.input.numel();
  const size_t elem = itemsize(c.input.dtype());
  std::vector<int> counts(static_cast<size_t>(c.n));
  std::vector<int> displs(static_cast<size_t>(c.n));
  int64_t offset = 0;
  for (int k = 0; k < c.n; ++k) {
    const int64_t len = total / c.n + (k < total % c.n ? 1 : 0);
    counts[static_cast<size_t>(k)] = count_of(c, len);
    displs[static_cast<size_t>(k)] = count_of(c, offset);
    offset += len;
  }
  const int mine = counts[static_cast<size_t>(c.index)];
  // Every member sends its k-th slice to member k and receives its own slice from everyone.
  std::vector<char> received(elem * static_cast<size_t>(mine) * static_cast<size_t>(c.n));
  std::vector<int> recv_counts(static_cast<size_t>(c.n), mine);
  std::vector<int> recv_displs(static_cast<size_t>(c.n));
  for (int i = 0; i < c.n; ++i)
    recv_displs[static_cast<size_t>(i)] = count_of(c, int64_t{mine} * i);
  check_mpi(MPI_Alltoallv(c.input.data_ptr(), counts.data(), displs.data(), c.type, received.data(),
                          recv_counts.data(), recv_displs.data(), c.type, c.comm_handle()),
            "MPI_Alltoallv", c.context());
  std::vector<char> slice(elem * static_cast<size_t>(mine));
  fold_blocks(c, op, received.data(), mine, slice.data());
  Tensor out = root < 0 || root == c.index ? empty(c.input.shape(), c.input.dtype()) : Tensor{};
  if (root < 0) {
    check_mpi(MPI_Allgatherv(slice.data(), mine, c.type, out.data_ptr(), counts.data(),
                             displs.data(), c.type, c.comm_handle()),
              "MPI_Allgatherv", c.context());
  } else {
    check_mpi(MPI_Gatherv(slice.data(), mine, c.type, out.defined() ? out.data_ptr() : nullptr,
                          counts.data(), displs.data(), c.type, root, c.comm_handle()),
              "MPI_Gatherv", c.context());
  }
  return out;
}

}  // namespace

// ---- lifetime -------------------------------------------------------------------------------

void mpi_initialize() {
  MpiState& s = state();
  if (s.finalized) {
    throw_error<Unsupported>("mpi backend: MPI was finalized in this process; it cannot restart");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (code != MPI_SUCCESS) {
      throw_error<CommError>("MPI_Init_thread failed: {}", mpi_error_string(code));
    }
    s.initialized_here = true;
    std::atexit(mpi_finalize);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &s.rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &s.size), "MPI_Comm_size");
  create_types_and_ops();
}

void mpi_finalize() {
  MpiState& s = state();
  s.watchdog.reset();  // first: the thread may call MPI_Abort
  if (s.finalized || !mpi_alive()) return;
  if (!s.failed.empty()) {
    fmt::print(stderr,
               "[rank {}] the mpi backend failed earlier ({}); a collective request is still "
               "pending, so MPI cannot finish: the job is aborted\n",
               s.rank, s.failed);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  // The notices' sends may still be in flight; freeing the communicator waits for them.
  if (s.notices != MPI_COMM_NULL) MPI_Comm_free(&s.notices);
  free_types_and_ops();
  if (s.initialized_here) {
    MPI_Finalize();
    s.finalized = true;
  }
}

bool mpi_is_initialized() {
  return mpi_alive();
}

int mpi_world_rank() {
  return state().rank;
}

int mpi_world_size() {
  return state().size;
}

void mpi_abort(int code) {
  if (mpi_alive()) MPI_Abort(MPI_COMM_WORLD, code);
}

namespace {

// Note [Exit notices]: tells every other process that this one's program has ended.
void send_exit_notice(const std::string& how) {
  MpiState& s = state();
  if (s.notices == MPI_COMM_NULL || !mpi_alive() || !s.notice.empty() || s.size < 2) return;
  std::string last;
  std::vector<TraceEvent> events = trace().events();
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    const bool mine = std::any_of(it->participants.begin(), it->participants.end(),
                                  [&](const TraceParticipant& p) { return p.rank == s.rank; });
    if (!mine) continue;
    Trace window;
    window.set_capacity(0);
    window.begin(std::move(*it));
    for (const TraceRecord& r : window.records()) {
      if (r.rank == s.rank) last = format_record(r);
    }
    break;
  }
  s.notice = encode_notice(how, last);
  for (int rank = 0; rank < s.size; ++rank) {
    if (rank == s.rank) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    // Small enough to be sent eagerly: it completes without a receiver; a failure on the way out
    // only costs the peers the prompt report.
    if (MPI_Isend(s.notice.data(), static_cast<int>(s.notice.size()), MPI_BYTE, rank, kExitTag,
                  s.notices, &request) == MPI_SUCCESS) {
      MPI_Request_free(&request);
    }
  }
}

}  // namespace

void mpi_finish_program(const std::string& how) {
  MpiState& s = state();
  send_exit_notice(how);
  activity().finishing();
  if (s.notices != MPI_COMM_NULL && s.failed.empty() && mpi_alive()) {
    // Every process's program has ended before any calls MPI_Finalize: a process inside
    // MPI_Finalize when the job is aborted (a peer that waited for this one reports it) can leave
    // OpenMPI 4.1's mpirun hung or crashed, while one waiting here is ended like any other.
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(s.notices, &request) == MPI_SUCCESS) {
      for (int done = 0; !done;) {
        if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }
  mpi_finalize();
}

std::string mpi_activity() {
  return activity().text();
}

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

// ---- collectives: one run() per collective, reached by MpiBackend::issue's visit -------------

namespace {

WorkPtr run(const Call& c, const LocalTensor& x, const AllReduceOptions& options) {
  const int count = count_of(c, c.input.numel());
  if (count > 0 && needs_rank_order(c.input.dtype(), options.op, c.n)) {
    return done(x, rank_ordered_reduce(c, options.op, -1));
  }
  Tensor out = empty(c.input.shape(), c.input.dtype());
  if (count > 0) {
    check_mpi(MPI_Allreduce(c.input.data_ptr(), out.data_ptr(), count, c.type,
                            mpi_op(options.op, c.input.dtype()), c.comm_handle()),
              "MPI_Allreduce", c.context());
  }
  if (options.op == ReduceOp::Avg) divide_in_place(out, c.n);
  return done(x, std::move(out));
}

WorkPtr run(const Call& c, const LocalTensor& x, const AllGatherOptions& options) {
  const int64_t d = wrap_dim(options.gather_dim, c.input.dim());
  Tensor buffer = empty(stacked_shape(c.n, c.input.shape()), c.input.dtype());
  const int count = count_of(c, c.input.numel());
  count_of(c, buffer.numel());
  if (count > 0) {
    check_mpi(MPI_Allgather(c.input.data_ptr(), count, c.type, buffer.data_ptr(), count, c.type,
                            c.comm_handle()),
              "MPI_Allgather", c.context());
  }
  return done(x, concat_blocks(buffer, d));
}

WorkPtr run(const Call& c, const LocalTensor& x, const ReduceScatterOptions& options) {
  const int64_t d = wrap_dim(options.scatter_dim, c.input.dim());
  Shape out_shape = c.input.shape();
  out_shape[static_cast<size_t>(d)] /= c.n;
  Tensor send = pieces_stacked(c.input, d, c.n);
  Tensor out = empty(out_shape, c.input.dtype());
  const int count = count_of(c, out.numel());
  count_of(c, send.numel());
  if (count > 0 && needs_rank_order(c.input.dtype(), options.op, c.n)) {
    // Member k's block of every member's input, then the rank-ordered fold (Note [Rank-ordered
    // floating reductions]).
    std::vector<char> received(send.nbytes());
    check_mpi(MPI_Alltoall(send.data_ptr(), count, c.type, received.data(), count, c.type,
                           c.comm_handle()),
              "MPI_Alltoall", c.context());
    fold_blocks(c, options.op, received.data(), count, out.data_ptr());
    return done(x, std::move(out));
  }
  if (count > 0) {
    check_mpi(MPI_Reduce_scatter_block(send.data_ptr(), out.data_ptr(), count, c.type,
                                       mpi_op(options.op, c.input.dtype()), c.comm_handle()),
              "MPI_Reduce_scatter_block", c.context());
  }
  if (options.op == ReduceOp::Avg) divide_in_place(out, c.n);
  return done(x, std::move(out));
}

WorkPtr run(const Call& c, const LocalTensor& x, const AllToAllOptions& options) {
  const int64_t split = wrap_dim(options.split_dim, c.input.dim());
  const int64_t concat = wrap_dim(options.concat_dim, c.input.dim());
  Shape piece_shape = c.input.shape();
  piece_shape[static_cast<size_t>(split)] /= c.n;
  // Piece j of the send buffer goes to group rank j; block i of `received` came from rank i.
  Tensor send = pieces_stacked(c.input, split, c.n);
  Tensor received = empty(stacked_shape(c.n, piece_shape), c.input.dtype());
  const int count = count_of(c, shape_numel(piece_shape));
  count_of(c, received.numel());
  if (count > 0) {
    check_mpi(MPI_Alltoall(send.data_ptr(), count, c.type, received.data_ptr(), count, c.type,
                           c.comm_handle()),
              "MPI_Alltoall", c.context());
  }
  return done(x, concat_blocks(received, concat));
}

WorkPtr run(const Call& c, const LocalTensor& x, const AllToAllSingleOptions& options) {
  const Tensor& in = c.input;
  const int64_t rows = in.size(0);
  const int64_t n = c.n;
  const std::vector<int64_t> in_splits = resolve_splits(options.in_splits, c.rank, rows, n);
  // Empty out_splits: an equal share of this rank's row count from every peer.
  const std::vector<int64_t> out_splits = resolve_splits(options.out_splits, c.rank, rows, n);

  // What every peer sends this rank must be what this rank expects (check_group_splits under
  // sim). Every member learns every member's verdict, so all of them throw the same error.
  std::vector<int64_t> incoming(static_cast<size_t>(n));
  check_mpi(MPI_Alltoall(in_splits.data(), 1, MPI_INT64_T, incoming.data(), 1, MPI_INT64_T,
                         c.comm_handle()),
            "MPI_Alltoall", c.context());
  int64_t verdict[3] = {-1, 0, 0};  // first sender whose rows differ, rows sent, rows expected
  for (int64_t i = 0; i < n; ++i) {
    if (incoming[static_cast<size_t>(i)] != out_splits[static_cast<size_t>(i)]) {
      verdict[0] = i;
      verdict[1] = incoming[static_cast<size_t>(i)];
      verdict[2] = out_splits[static_cast<size_t>(i)];
      break;
    }
  }
  std::vector<int64_t> verdicts(static_cast<size_t>(3 * n));
  check_mpi(
      MPI_Allgather(verdict, 3, MPI_INT64_T, verdicts.data(), 3, MPI_INT64_T, c.comm_handle()),
      "MPI_Allgather", c.context());
  for (int64_t j = 0; j < n; ++j) {
    const int64_t* v = &verdicts[static_cast<size_t>(3 * j)];
    if (v[0] < 0) continue;
    const std::vector<int>& members = c.comm->members();
    throw_error<CommError>(
        "{}: split sizes do not match: rank {} sends {} rows to rank {}, which "
        "expects {}",
        c.describe(), members[static_cast<size_t>(v[0])], v[1], members[static_cast<size_t>(j)],
        v[2]);
  }

  Shape out_shape = in.shape();
  out_shape[0] = 0;
  for (int64_t s : out_splits) out_shape[0] += s;
  Tensor out = empty(out_shape, in.dtype());
  const int64_t row_numel = shape_numel(Shape(in.shape().begin() + 1, in.shape().end()));
  std::vector<int> send_counts(static_cast<size_t>(n)), send_displs(static_cast<size_t>(n));
  std::vector<int> recv_counts(static_cast<size_t>(n)), recv_displs(static_cast<size_t>(n));
  int64_t send_at = 0;
  int64_t recv_at = 0;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    send_counts[i] = count_of(c, in_splits[i] * row_numel);
    send_displs[i] = count_of(c, send_at);
    recv_counts[i] = count_of(c, out_splits[i] * row_numel);
    recv_displs[i] = count_of(c, recv_at);
    send_at += in_splits[i] * row_numel;
    recv_at += out_splits[i] * row_numel;
  }
  check_mpi(
      MPI_Alltoallv(in.data_ptr(), send_counts.data(), send_displs.data(), c.type, out.data_ptr(),
                    recv_counts.data(), recv_displs.data(), c.type, c.comm_handle()),
      "MPI_Alltoallv", c.context());
  return done(x, std::move(out));
}

WorkPtr run(const Call& c, const LocalTensor& x, const BroadcastOptions& options) {
  const bool root = c.index == options.src;
  Tensor buffer = root ? c.input : empty(c.input.shape(), c.input.dtype());
  const int count = count_of(c, c.input.numel());
  if (count > 0) {
    check_mpi(MPI_Bcast(buffer.data_ptr(), count, c.type, options.src, c.comm_handle()),
              "MPI_Bcast", c.context());
  }
  // The source keeps its own shard, as under sim.
  return done(x, root ? x.shards()[0] : std::move(buffer));
}

WorkPtr run(const Call& c, const LocalTensor& x, const ScatterOptions& options) {
  const int64_t d = wrap_dim(options.scatter_dim, c.input.dim());
  Shape piece_shape = c.input.shape();
  piece_shape[static_cast<size_t>(d)] /= c.n;
  Tensor send = c.index == options.src ? pieces_stacked(c.input, d, c.n) : Tensor{};
  Tensor out = empty(piece_shape, c.input.dtype());
  const int count = count_of(c, out.numel());
  count_of(c, c.input.numel());
  if (count > 0) {
    check_mpi(MPI_Scatter(send.defined() ? send.data_ptr() : nullptr, count, c.type, out.data_ptr(),
                          count, c.type, options.src, c.comm_handle()),
              "MPI_Scatter", c.context());
  }
  return done(x, std::move(out));
}

WorkPtr run(const Call& c, const LocalTensor& x, const GatherOptions& options) {
  const int64_t d = wrap_dim(options.gather_dim, c.input.dim());
  const bool root = c.index == options.dst;
  Tensor buffer = root ? empty(stacked_shape(c.n, c.input.shape()), c.input.dtype()) : Tensor{};
  const int count = count_of(c, c.input.numel());
  count_of(c, c.input.numel() * c.n);
  if (count > 0) {
    check_mpi(MPI_Gather(c.input.data_ptr(), count, c.type, root ? buffer.data_ptr() : nullptr,
                         count, c.type, options.dst, c.comm_handle()),
              "MPI_Gather", c.context());
  }
  if (root) return done(x, concat_blocks(buffer, d));
  Shape none = c.input.shape();
  none[static_cast<size_t>(d)] = 0;
  return done(x, empty(none, c.input.dtype()));
}

WorkPtr run(const Call& c, const LocalTensor& x, const ReduceOptions& options) {
  if (c.input.dim() == 0) {
    throw_error<CommError>(
        "{}: a 0-d input has no empty form for the non-destination ranks; reshape it to [1]",
        c.describe());
  }
  const bool root = c.index == options.dst;
  Tensor out = root ? empty(c.input.shape(), c.input.dtype()) : Tensor{};
  const int count = count_of(c, c.input.numel());
  const bool ordered = count > 0 && needs_rank_order(c.input.dtype(), options.op, c.n);
  if (ordered) {
    out = rank_ordered_reduce(c, options.op, options.dst);  // Avg divided by the fold
  } else if (count > 0) {
    check_mpi(MPI_Reduce(c.input.data_ptr(), root ? out.data_ptr() : nullptr, count, c.type,
                         mpi_op(options.op, c.input.dtype()), options.dst, c.comm_handle()),
              "MPI_Reduce", c.context());
  }
  if (root) {
    if (options.op == ReduceOp::Avg && !ordered) divide_in_place(out, c.n);
    return done(x, std::move(out));
  }
  Shape none = c.input.shape();
  none[0] = 0;
  return done(x, empty(none, c.input.dtype()));
}

WorkPtr run(const Call& c, const LocalTensor& x, const PermuteOptions& options) {
  const int dest = options.dst_of[static_cast<size_t>(c.index)];
  int source = -1;
  for (int i = 0; i < c.n; ++i) {
    if (options.dst_of[static_cast<size_t>(i)] == c.index) source = i;
  }
  // A rank that receives nothing gets zeros of its own shape (jax.lax.ppermute).
  Tensor out = source < 0 ? zeros(c.input.shape(), c.input.dtype())
                          : empty(c.input.shape(), c.input.dtype());
  const int count = count_of(c, c.input.numel());
  if (count > 0) {
    MPI_Request requests[2];
    int pending = 0;
    if (source >= 0) {
      check_mpi(MPI_Irecv(out.data_ptr(), count, c.type, source, 0, c.comm_handle(),
                          &requests[pending++]),
                "MPI_Irecv", c.context());
    }
    if (dest >= 0) {
      check_mpi(MPI_Isend(c.input.data_ptr(), count, c.type, dest, 0, c.comm_handle(),
                          &requests[pending++]),
                "MPI_Isend", c.context());
    }
    check_mpi(MPI_Waitall(pending, requests, MPI_STATUSES_IGNORE), "MPI_Waitall", c.context());
  }
  return done(x, std::move(out));
}

WorkPtr run(const Call& c, const LocalTensor& x, const BarrierOptions&) {
  check_mpi(MPI_Barrier(c.comm_handle()), "MPI_Barrier", c.context());
  return std::make_shared<CompletedWork>(x);
}

}  // namespace

WorkPtr MpiBackend::issue(Communicator& comm, const LocalTensor& x,
                          const CollectiveOptions& options, const CallSite& site) {
  const Call c = prepare_call(comm, x, options, site, rank_);
  ActivityScope scope(c, site);
  exchange_signatures(c, options, site, fingerprint_);
  activity().step("the data exchange");
  return std::visit([&](const auto& o) { return run(c, x, o); }, options);
}

}  // namespace spmd
