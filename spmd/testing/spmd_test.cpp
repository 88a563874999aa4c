// spmd/testing/spmd_test.cpp: the test world, SPMD_TEST's body runner and registry, and the test
// program's main loop (run_all_tests).
#include <spmd/testing/spmd_test.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>

#include <spmd/core/format.h>
#include <spmd/runtime/launch.h>
#include <spmd/world/backend_driver.h>

namespace spmd::testing {
namespace {

struct State {
  std::mutex mutex;
  std::optional<LaunchOptions> options;  // set by run_all_tests
  std::map<int, World> sim_worlds;       // sim: by size
  World process_world;                   // mpi, nccl
  std::set<std::string> spmd_tests;      // "Suite.Name"
};

State& state() {
  static State s;
  return s;
}

bool runs_thread_per_world(const LaunchOptions& options) {
  const BackendDriver* driver = find_backend_driver(options.backend);
  return driver != nullptr && driver->thread_per_world;
}

// A backend whose processes each hold their own rank(s): mpi, nccl.
bool is_process_backend(const LaunchOptions& options) {
  return options.backend != "sim" && !runs_thread_per_world(options);
}

std::string current_test_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? fmt::format("{}.{}", info->test_suite_name(), info->name()) : "(no test)";
}

// Prints a rank's failures (the coordinator prints GoogleTest's report), each line prefixed with
// the rank, on stderr.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    const std::string text =
        fmt::format("{}:{}: Failure\n{}", result.file_name() ? result.file_name() : "?",
                    result.line_number(), result.message());
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      fmt::print(stderr, "[rank {}] {}\n", rank_,
                 std::string_view(text).substr(start, end - start));
      start = end + 1;
    }
    std::fflush(stderr);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    fmt::print(stderr, "[rank {}] [  FAILED  ] {}.{}\n", rank_, info.test_suite_name(),
               info.name());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

// GoogleTest's filter syntax: positive patterns, then optionally '-' and negative patterns, each
// list separated by ':'; '*' matches any string and '?' any character.
bool glob_match(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return name.empty();
  if (pattern[0] == '*') {
    for (size_t i = 0; i <= name.size(); ++i) {
      if (glob_match(pattern.substr(1), name.substr(i))) return true;
    }
    return false;
  }
  return !name.empty() && (pattern[0] == '?' || pattern[0] == name[0]) &&
         glob_match(pattern.substr(1), name.substr(1));
}

bool any_pattern_matches(std::string_view patterns, std::string_view name) {
  while (true) {
    const size_t colon = patterns.find(':');
    if (glob_match(patterns.substr(0, colon), name)) return true;
    if (colon == std::string_view::npos) return false;
    patterns.remove_prefix(colon + 1);
  }
}

bool filter_selects(std::string_view filter, std::string_view name) {
  const size_t dash = filter.find('-');
  const std::string_view positive = filter.substr(0, dash);
  const bool included = positive.empty() ? true : any_pattern_matches(positive, name);
  if (!included) return false;
  return dash == std::string_view::npos || !any_pattern_matches(filter.substr(dash + 1), name);
}

// Prints the tests --gtest_filter selects (disabled ones left out), "spmd Suite.Name" for an
// SPMD_TEST and "gtest Suite.Name" for any other.
void print_test_list() {
  const std::string filter = GTEST_FLAG_GET(filter);
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const ::testing::TestInfo& info = *suite.GetTestInfo(t);
      const std::string name = fmt::format("{}.{}", info.test_suite_name(), info.name());
      if (std::string_view(info.test_suite_name()).starts_with("DISABLED_") ||
          std::string_view(info.name()).starts_with("DISABLED_") || !filter_selects(filter, name)) {
        continue;
      }
      std::printf("%s %s\n", is_spmd_test(name) ? "spmd" : "gtest", name.c_str());
    }
  }
  std::fflush(stdout);
}

// Removes `flag` from argv; true when it was there.
bool take_flag(int& argc, char** argv, const char* flag) {
  bool found = false;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) {
      found = true;
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  argv[argc] = nullptr;
  return found;
}

}  // namespace

LaunchOptions test_options() {
  State& s = state();
  {
    std::lock_guard lock(s.mutex);
    if (s.options) return *s.options;
  }
  return launch_options_from_env();
}

void set_test_options(const LaunchOptions& options) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.options = options;
}

World test_world(int default_size) {
  LaunchOptions options = test_options();
  // Each rank thread has its own world; make_world returns the calling thread's.
  if (runs_thread_per_world(options)) return make_world(options);
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (options.backend != "sim") {
    if (!s.process_world.defined()) s.process_world = make_world(options);
    return s.process_world;
  }
  if (!options.world_size) {
    options.world_size = default_size;
    options.world_size_source = fmt::format("test_world({})", default_size);
  }
  auto it = s.sim_worlds.find(*options.world_size);
  if (it == s.sim_worlds.end()) {
    it = s.sim_worlds.emplace(*options.world_size, make_world(options)).first;
  }
  return it->second;
}

void finish_test_world() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  for (auto& [size, world] : s.sim_worlds) finish_world(world);
  finish_world(s.process_world);
}

void run_test_body(const std::function<void(World&)>& body) {
  const LaunchOptions options = test_options();
  if (runs_thread_per_world(options)) {
    const std::vector<RankOutcome> outcomes = run_rank_threads(options, [&](World& world) {
      body(world);
      return 0;
    });
    // Ranks that failed with the same error are reported together.
    std::vector<std::pair<std::string, std::vector<int>>> reports;
    for (const RankOutcome& outcome : outcomes) {
      if (!outcome.error) continue;
      const std::string text = error_text(outcome.error);
      auto it = std::find_if(reports.begin(), reports.end(),
                             [&](const auto& r) { return r.first == text; });
      if (it == reports.end()) {
        reports.push_back({text, {outcome.rank}});
      } else {
        it->second.push_back(outcome.rank);
      }
    }
    for (const auto& [text, ranks] : reports) {
      ADD_FAILURE() << "[" << ranks_text(ranks) << "] " << text;
    }
    return;
  }
  World world = test_world();
  body(world);
  if (is_process_backend(options) && ::testing::Test::HasFatalFailure()) {
    fmt::print(stderr,
               "[{}] {}: a fatal assertion failed on this rank; ending the job, so that no "
               "rank waits for this one in a collective\n",
               ranks_text(world.held_ranks()), current_test_name());
    std::fflush(stderr);
    std::fflush(stdout);
    abort_job(1);
  }
}

bool register_spmd_test(const char* suite, const char* name) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.spmd_tests.insert(fmt::format("{}.{}", suite, name));
  return true;
}

bool is_spmd_test(const std::string& full_name) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.spmd_tests.count(full_name) > 0;
}

int run_all_tests(int& argc, char** argv) {
  const bool list = take_flag(argc, argv, "--spmd-list-tests");
  ::testing::InitGoogleTest(&argc, argv);
  if (list) {
    print_test_list();
    return 0;
  }
  LaunchOptions options;
  const BackendDriver* driver = nullptr;
  try {
    options = parse_launch_options(argc, argv);
    driver = &backend_driver(options.backend, options.backend_source);
  } catch (...) {
    report_error(std::current_exception(), std::vector<int>{});
    return 2;
  }
  set_test_options(options);
  const bool listing = GTEST_FLAG_GET(list_tests);
  // A backend that cannot start on this machine (nccl without a usable GPU) skips the run
  // (CTest's SKIP_RETURN_CODE 77), in every rank.
  if (driver->unavailable && !listing) {
    if (const std::optional<std::string> why = driver->unavailable()) {
      std::printf("[  SKIPPED ] %s\n", why->c_str());
      return 77;
    }
  }
  World world;
  try {
    if (!listing) {
      if (is_process_backend(options)) {
        // A rank that throws ends the job here (below) instead of leaving its peers waiting.
        GTEST_FLAG_SET(catch_exceptions, false);
        world = test_world();
        if (world.is_coordinator()) {
          std::printf("spmd tests: backend %s, %d ranks, one per process\n",
                      world.backend_name().c_str(), world.size());
        } else {
          ::testing::TestEventListeners& listeners =
              ::testing::UnitTest::GetInstance()->listeners();
          delete listeners.Release(listeners.default_result_printer());
          listeners.Append(new RankFailurePrinter(world.held_ranks().front()));
        }
      } else if (!options.backend_source.empty() || !options.world_size_source.empty()) {
        std::printf("spmd tests: backend %s, world size %s\n", options.backend.c_str(),
                    options.world_size ? std::to_string(*options.world_size).c_str() : "default");
      }
    }
    const int code = RUN_ALL_TESTS();
    finish_test_world();
    return code;
  } catch (...) {
    report_error(std::current_exception(), world);
    abort_job(1);
    return 1;
  }
}

}  // namespace spmd::testing
