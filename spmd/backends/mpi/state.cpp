// spmd/backends/mpi/state.cpp: the process's MPI state, the datatypes and user ops, and MPI's
// lifetime in this process.
#include <spmd/backends/mpi/state.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include <spmd/backends/mpi/exit_notice.h>
#include <spmd/backends/mpi/watchdog.h>
#include <spmd/collectives/reduce_kernels.h>

namespace spmd {
namespace mpi {

MpiState& state() {
  static MpiState s;
  return s;
}

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

void check_mpi(int code, const char* call) {
  check_mpi(code, call, [] { return std::string("mpi backend"); });
}

World describing_world() {
  auto world = std::make_shared<WorldState>();
  world->size = state().size;
  world->held_ranks = {state().rank};
  world->backend_name = "mpi";
  return World(std::move(world));
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

// ---- datatypes and ops ----------------------------------------------------------------------

namespace {

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

}  // namespace

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
    case DType::F8E4M3FN:  // moved, never reduced (collectives/validate.cpp)
    case DType::F8E5M2:
      return MPI_UINT8_T;
  }
  throw_error<InternalError>("mpi backend: unknown dtype");
}

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

}  // namespace mpi

using namespace mpi;  // the backend's internals

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

}  // namespace spmd
