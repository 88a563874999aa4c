// tests/support/test_main.cpp: main() of the test executables whose bodies take their World from
// test_world(), so one source runs under sim and under `mpirun -n N` with SPMD_BACKEND=mpi.
//
// Under threads (SPMD_BACKEND=threads) the process is one test program as under sim; SPMD_TEST
// bodies run once per rank thread (tests/support/world_env.h).
//
// Under a real backend every rank runs every test and checks its own rank's results. The
// coordinator prints GoogleTest's usual report; the other ranks print only their failures, each
// line prefixed with the rank. Exceptions are not caught per test there: a rank that throws
// would leave its peers waiting in a collective, so the exception reaches main(), which prints it
// with the rank and ends the whole job (abort_job), exactly as launch() does.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

#include <spmd/core/env.h>
#include <spmd/runtime/launch.h>
#include <spmd/sim/backend_driver.h>
#include "tests/support/world_env.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::string text = std::string(result.file_name() ? result.file_name() : "?") + ":" +
                       std::to_string(result.line_number()) + ": Failure\n" + result.message();
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::fprintf(stderr, "[rank %d] %.*s\n", rank_, static_cast<int>(end - start),
                   text.data() + start);
      start = end + 1;
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // threads runs in this process like sim: the rank threads report through GoogleTest.
  const std::string backend = spmd::env_value("SPMD_BACKEND").value_or("sim");
  const bool real_backend = backend != "sim" && backend != "threads";
  // A backend that cannot start on this machine (nccl without a usable GPU) skips the run
  // (CTest's SKIP_RETURN_CODE 77), in every rank.
  const spmd::BackendDriver* driver = spmd::find_backend_driver(backend);
  if (driver && driver->unavailable && !GTEST_FLAG_GET(list_tests)) {
    if (const std::optional<std::string> why = driver->unavailable()) {
      std::printf("[  SKIPPED ] %s\n", why->c_str());
      return 77;
    }
  }
  spmd::World world;
  try {
    if (real_backend && !GTEST_FLAG_GET(list_tests)) {
      GTEST_FLAG_SET(catch_exceptions, false);
      world = spmd::testing::test_world();
      if (world.is_coordinator()) {
        std::printf("test world: backend %s, %d ranks, one per process\n",
                    world.backend_name().c_str(), world.size());
      } else {
        ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter(world.held_ranks().front()));
      }
    }
    const int code = RUN_ALL_TESTS();
    spmd::testing::finish_test_world();
    return code;
  } catch (...) {
    spmd::report_error(std::current_exception(), world);
    spmd::abort_job(1);
    return 1;
  }
}
