// runtime/ in process: flag and environment parsing, launcher detection, trace file names, the
// world factory, digests and launch() itself under sim.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/config.h>
#include <spmd/ops/ops.h>
#include <spmd/runtime/digest.h>
#include <spmd/runtime/launch.h>
#include <spmd/runtime/options.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

// Sets (or, with nullopt, unsets) environment variables for one scope.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, std::optional<std::string>>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
      if (value) {
        setenv(name, value->c_str(), 1);
      } else {
        unsetenv(name);
      }
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// No SPMD_* or launcher variables from the environment the tests run in.
ScopedEnv clean_env() {
  return ScopedEnv({{"SPMD_BACKEND", std::nullopt},
                    {"SPMD_WORLD_SIZE", std::nullopt},
                    {"SPMD_TRACE", std::nullopt},
                    {"SPMD_DEBUG", std::nullopt},
                    {"SPMD_TOPOLOGY", std::nullopt},
                    {"SPMD_TIMEOUT", std::nullopt},
                    {"SPMD_NCCL_TIMEOUT", std::nullopt},
                    {"SPMD_RANK", std::nullopt},
                    {"OMPI_COMM_WORLD_RANK", std::nullopt},
                    {"OMPI_COMM_WORLD_SIZE", std::nullopt},
                    {"SLURM_PROCID", std::nullopt},
                    {"SLURM_NTASKS", std::nullopt}});
}

// argv storage for parse_launch_options.
struct Args {
  explicit Args(std::vector<std::string> args) : strings(std::move(args)) {
    for (std::string& s : strings) pointers.push_back(s.data());
    pointers.push_back(nullptr);
    argc = static_cast<int>(strings.size());
  }
  std::vector<std::string> remaining() const {
    std::vector<std::string> out;
    for (int i = 0; i < argc; ++i) out.emplace_back(pointers[static_cast<size_t>(i)]);
    EXPECT_EQ(pointers[static_cast<size_t>(argc)], nullptr);
    return out;
  }
  std::vector<std::string> strings;
  std::vector<char*> pointers;
  int argc = 0;
};

// ---- options --------------------------------------------------------------------------------

TEST(LaunchOptions, DefaultsWithoutFlagsOrEnvironment) {
  auto env = clean_env();
  Args args({"prog", "a", "b"});
  LaunchOptions o = parse_launch_options(args.argc, args.pointers.data());
  EXPECT_EQ(o.backend, "sim");
  EXPECT_FALSE(o.world_size.has_value());
  EXPECT_TRUE(o.trace_path.empty());
  EXPECT_FALSE(o.debug.any());
  EXPECT_EQ(args.remaining(), (std::vector<std::string>{"prog", "a", "b"}));
}

TEST(LaunchOptions, FlagsAreReadAndRemovedFromArgv) {
  auto env = clean_env();
  Args args({"prog", "--spmd-backend=mpi", "x", "--spmd-world-size", "4", "--spmd-trace=t.json",
             "--spmd-debug=check,nan", "--spmd-topology=topo.json", "y"});
  LaunchOptions o = parse_launch_options(args.argc, args.pointers.data());
  EXPECT_EQ(o.backend, "mpi");
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.trace_path, "t.json");
  EXPECT_TRUE(o.debug.check);
  EXPECT_TRUE(o.debug.nan);
  EXPECT_FALSE(o.debug.fingerprint);
  EXPECT_EQ(o.topology_path, "topo.json");
  EXPECT_EQ(o.world_size_source, "--spmd-world-size=4");
  EXPECT_EQ(args.remaining(), (std::vector<std::string>{"prog", "x", "y"}));
}

TEST(LaunchOptions, FlagsWinOverTheEnvironment) {
  auto env = clean_env();
  ScopedEnv vars({{"SPMD_BACKEND", "mpi"}, {"SPMD_WORLD_SIZE", "6"}, {"SPMD_DEBUG", "replicate"}});
  {
    Args args({"prog"});
    LaunchOptions o = parse_launch_options(args.argc, args.pointers.data());
    EXPECT_EQ(o.backend, "mpi");
    EXPECT_EQ(o.world_size, 6);
    EXPECT_EQ(o.world_size_source, "SPMD_WORLD_SIZE=6");
    EXPECT_TRUE(o.debug.replicate);
  }
  Args args({"prog", "--spmd-backend=sim", "--spmd-world-size=3", "--spmd-debug=fingerprint"});
  LaunchOptions o = parse_launch_options(args.argc, args.pointers.data());
  EXPECT_EQ(o.backend, "sim");
  EXPECT_EQ(o.world_size, 3);
  EXPECT_TRUE(o.debug.fingerprint);
  EXPECT_FALSE(o.debug.replicate);
}

TEST(LaunchOptions, ParsingStopsAtDoubleDash) {
  auto env = clean_env();
  Args args({"prog", "--", "--spmd-backend=mpi"});
  LaunchOptions o = parse_launch_options(args.argc, args.pointers.data());
  EXPECT_EQ(o.backend, "sim");
  EXPECT_EQ(args.remaining(), (std::vector<std::string>{"prog", "--", "--spmd-backend=mpi"}));
}

TEST(LaunchOptions, BadValuesAreConfigErrors) {
  auto env = clean_env();
  auto parse = [](std::vector<std::string> a) {
    Args args(std::move(a));
    return parse_launch_options(args.argc, args.pointers.data());
  };
  expect_throws<ConfigError>(
      [&] {
        parse({"p", "--spmd-backend=gloo"});
      },
      {"unknown backend 'gloo' (--spmd-backend=gloo); valid backends: sim, "
       "threads, mpi, nccl"});
  expect_throws<ConfigError>(
      [&] {
        parse({"p", "--spmd-world-size=0"});
      },
      {"--spmd-world-size=0", "positive integer"});
  expect_throws<ConfigError>([&] { parse({"p", "--spmd-world-size=4x"}); }, {"'4x'"});
  expect_throws<ConfigError>(
      [&] {
        parse({"p", "--spmd-debug=check,speed"});
      },
      {"unknown debug check 'speed'", "fingerprint"});
  expect_throws<ConfigError>(
      [&] {
        parse({"p", "--spmd-backed=mpi"});
      },
      {"unknown flag '--spmd-backed=mpi'", "--spmd-backend"});
  expect_throws<ConfigError>([&] { parse({"p", "--spmd-trace"}); }, {"needs a value"});
  ScopedEnv bad({{"SPMD_BACKEND", "cuda"}});
  expect_throws<ConfigError>([&] { parse({"p"}); }, {"unknown backend 'cuda' (SPMD_BACKEND=cuda)"});
}

TEST(LaunchOptions, TimeoutFlagAndItsOlderName) {
  auto env = clean_env();
  auto parse = [](std::vector<std::string> a) {
    Args args(std::move(a));
    return parse_launch_options(args.argc, args.pointers.data());
  };
  EXPECT_FALSE(parse({"p"}).timeout_s.has_value());
  EXPECT_EQ(parse({"p", "--spmd-timeout=2.5"}).timeout_s, 2.5);
  EXPECT_EQ(parse({"p", "--spmd-timeout", "7"}).timeout_s, 7.0);
  // The nccl backend's older name still works; the later flag wins.
  EXPECT_EQ(parse({"p", "--spmd-nccl-timeout=30"}).timeout_s, 30.0);
  EXPECT_EQ(parse({"p", "--spmd-nccl-timeout=30", "--spmd-timeout=4"}).timeout_s, 4.0);
  {
    ScopedEnv vars({{"SPMD_TIMEOUT", "9"}, {"SPMD_NCCL_TIMEOUT", "12.5"}});
    EXPECT_EQ(parse({"p"}).timeout_s, 9.0);  // SPMD_TIMEOUT wins over the older name
    EXPECT_EQ(parse({"p", "--spmd-timeout=3"}).timeout_s, 3.0);
  }
  for (const char* bad : {"0", "-1", "abc", "5s", "", "inf", "nan"}) {
    expect_throws<ConfigError>(
        [&] {
          parse({"p", std::string("--spmd-timeout=") + bad});
        },
        {"--spmd-timeout=", "positive number of seconds"});
    if (*bad == '\0') continue;  // an empty variable counts as unset
    ScopedEnv var({{"SPMD_TIMEOUT", bad}});
    expect_throws<ConfigError>([&] { parse({"p"}); }, {"SPMD_TIMEOUT=", "positive number"});
  }
  // Only the current name is listed among the valid flags.
  try {
    parse({"p", "--spmd-timeuot=3"});
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--spmd-timeout"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("--spmd-nccl-timeout"), std::string::npos) << e.what();
  }
}

TEST(LaunchOptions, DebugList) {
  DebugOptions d = parse_debug_options("check,replicate,,fingerprint,nan");
  EXPECT_TRUE(d.check && d.replicate && d.fingerprint && d.nan);
  EXPECT_FALSE(parse_debug_options("").any());
}

// ---- launchers ------------------------------------------------------------------------------

TEST(Launcher, NoneWithoutItsVariables) {
  auto env = clean_env();
  EXPECT_FALSE(detect_launcher().has_value());
}

TEST(Launcher, MpirunSrunAndSpmdrunInThatOrder) {
  auto env = clean_env();
  {
    ScopedEnv vars({{"SPMD_RANK", "1"}, {"SPMD_WORLD_SIZE", "2"}, {"SPMD_LOCAL_RANK", "1"}});
    auto l = detect_launcher();
    ASSERT_TRUE(l);
    EXPECT_EQ(l->name, "spmdrun");
    EXPECT_EQ(l->rank, 1);
    EXPECT_EQ(l->size, 2);
    EXPECT_EQ(l->local_rank, 1);
  }
  {
    ScopedEnv vars({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}});
    auto l = detect_launcher();
    ASSERT_TRUE(l);
    EXPECT_EQ(l->name, "srun");
    EXPECT_EQ(l->rank, 5);
    EXPECT_EQ(l->size, 16);
    EXPECT_EQ(l->local_rank, 1);
    ScopedEnv mpi({{"OMPI_COMM_WORLD_RANK", "2"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    l = detect_launcher();
    ASSERT_TRUE(l);
    EXPECT_EQ(l->name, "mpirun");
    EXPECT_EQ(l->rank, 2);
    EXPECT_EQ(l->size, 4);
    EXPECT_EQ(l->local_size, 2);
    EXPECT_EQ(l->size_variable, "OMPI_COMM_WORLD_SIZE");
  }
}

TEST(Launcher, InconsistentVariablesAreConfigErrors) {
  auto env = clean_env();
  ScopedEnv vars({{"SPMD_RANK", "3"}, {"SPMD_WORLD_SIZE", "2"}});
  expect_throws<ConfigError>([] { detect_launcher(); }, {"spmdrun", "SPMD_RANK=3"});
  ScopedEnv junk({{"SPMD_RANK", "one"}});
  expect_throws<ConfigError>([] { detect_launcher(); }, {"SPMD_RANK='one' is not an integer"});
}

// ---- worlds ---------------------------------------------------------------------------------

TEST(MakeWorld, SimWithTheRequestedSizeAndOptions) {
  auto env = clean_env();
  LaunchOptions o;
  o.world_size = 5;
  o.debug.replicate = true;
  World world = make_world(o);
  EXPECT_EQ(world.backend_name(), "sim");
  EXPECT_EQ(world.size(), 5);
  EXPECT_EQ(world.held_ranks().size(), 5u);
  EXPECT_TRUE(world.is_coordinator());
  EXPECT_TRUE(world.debug().replicate);
  EXPECT_EQ(make_world(LaunchOptions{}).size(), 8);
}

TEST(MakeWorld, TopologyFromAFile) {
  auto env = clean_env();
  const std::string path = ::testing::TempDir() + "/runtime_test_topology.json";
  std::ofstream(path) << R"({"devices_per_host": 4, "base_latency_us": 1.5})";
  LaunchOptions o;
  o.topology_path = path;
  World world = make_world(o);
  EXPECT_EQ(world.topology().devices_per_host, 4);
  EXPECT_EQ(world.topology().base_latency_us, 1.5);
  o.topology_path = path + ".missing";
  expect_throws<ConfigError>([&] { make_world(o); }, {"cannot open"});
}

TEST(MakeWorld, BackendsThisBuildCannotMake) {
  auto env = clean_env();
  LaunchOptions o;
  o.backend = "nccl";
#if SPMD_HAVE_NCCL
  // This test links spmd::spmd only.
  expect_throws<ConfigError>(
      [&] { make_world(o); },
      {"the nccl backend is not linked into this program: link it with spmd::nccl"});
#else
  expect_throws<Unsupported>(
      [&] { make_world(o); },
      {"this build has no NCCL backend; configure with -DSPMD_WITH_NCCL=ON"});
#endif
  // A threads world exists only on a rank thread (tests/backends/threads covers those).
  o.backend = "threads";
  expect_throws<ConfigError>([&] { make_world(o); }, {"--spmd-backend=threads", "rank threads"});
  o.backend = "mpi";
#if SPMD_HAVE_MPI
  expect_throws<ConfigError>([&] { make_world(o); },
                             {"--spmd-backend=mpi needs a launcher: run it with mpirun -n N ..."});
  ScopedEnv spmdrun({{"SPMD_RANK", "0"}, {"SPMD_WORLD_SIZE", "2"}});
  expect_throws<ConfigError>([&] { make_world(o); }, {"cannot run under spmdrun"});
  ScopedEnv mpirun({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  o.world_size = 4;
  o.world_size_source = "--spmd-world-size=4";
  expect_throws<ConfigError>(
      [&] { make_world(o); },
      {"--spmd-world-size=4 disagrees with the launcher: mpirun started 2 processes"});
#else
  expect_throws<Unsupported>([&] { make_world(o); },
                             {"this build has no MPI backend; configure with -DSPMD_WITH_MPI=ON"});
#endif
}

TEST(TraceFile, RankInsertedBeforeTheExtension) {
  auto state = std::make_shared<WorldState>();
  state->size = 8;
  state->held_ranks = {3};
  World one(state);
  EXPECT_EQ(trace_file_for(one, "out/trace.json"), "out/trace.rank3.json");
  EXPECT_EQ(trace_file_for(one, "trace"), "trace.rank3");
  EXPECT_EQ(trace_file_for(one, "dir.d/trace"), "dir.d/trace.rank3");
  EXPECT_EQ(trace_file_for(one, ".trace"), ".trace.rank3");
  EXPECT_EQ(trace_file_for(World::sim(4), "out/trace.json"), "out/trace.json");
}

// ---- digests --------------------------------------------------------------------------------

TEST(Digest, Fnv1aReferenceVectors) {
  // The published FNV-1a 64 test vectors.
  EXPECT_EQ(fnv1a("", 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a("a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a("foobar", 6), 0x85944171f73967e8ULL);
  EXPECT_EQ(digest_hex(0xabcULL), "0000000000000abc");
}

TEST(Digest, TensorDigestSeesDtypeShapeAndValuesButNotStrides) {
  Tensor a = arange(6).reshape({2, 3});
  EXPECT_EQ(digest(a), digest(a.clone()));
  EXPECT_EQ(digest(a.transpose(0, 1)), digest(a.transpose(0, 1).contiguous()));
  EXPECT_NE(digest(a), digest(a.reshape({3, 2})));
  EXPECT_NE(digest(a), digest(a.to(DType::F64)));
  EXPECT_NE(digest(a), digest(a + 1.0));
}

TEST(Digest, CombinedDigestIsOrdered) {
  Tensor a = arange(3);
  Tensor b = ones({2});
  EXPECT_EQ(combined_digest({a, b}), combined_digest({a.clone(), b.clone()}));
  EXPECT_NE(combined_digest({a, b}), combined_digest({b, a}));
}

TEST(Digest, WorldDigestCoversEveryRankInOrder) {
  World world = World::sim(4);
  LocalTensor x = LocalTensor::from_fn(world, [](int r) { return full({2}, r); });
  LocalTensor swapped = LocalTensor::from_fn(world, [](int r) { return full({2}, 3 - r); });
  EXPECT_EQ(digest(world, {x}), digest(world, {x.clone()}));
  EXPECT_NE(digest(world, {x}), digest(world, {swapped}));
  EXPECT_NE(digest(world, {x, swapped}), digest(world, {swapped, x}));
  LocalTensor part({0, 1}, {full({2}, 0), full({2}, 1)});
  EXPECT_NE(digest(world, {x}), digest(world, {part}));
  ::testing::internal::CaptureStdout();
  const uint64_t d = print_digest(world, {x});
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "digest: " + digest_hex(d) + "\n");
}

// ---- launch() -------------------------------------------------------------------------------

TEST(Launch, RunsTheProgramOnTheWorldAndReturnsItsCode) {
  auto env = clean_env();
  Args args({"prog", "--spmd-world-size=3", "keep"});
  int seen_size = 0;
  int code = launch(args.argc, args.pointers.data(), [&](World& world) {
    seen_size = world.size();
    return 7;
  });
  EXPECT_EQ(code, 7);
  EXPECT_EQ(seen_size, 3);
  EXPECT_EQ(args.remaining(), (std::vector<std::string>{"prog", "keep"}));
  Args again({"prog"});
  EXPECT_EQ(launch(again.argc, again.pointers.data(), [](World&) {}), 0);
}

TEST(Launch, AnUncaughtErrorIsPrintedWithItsRanksAndGivesExitCode1) {
  auto env = clean_env();
  Args args({"prog", "--spmd-world-size=4"});
  ::testing::internal::CaptureStderr();
  int code = launch(args.argc, args.pointers.data(), [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {4});
    LocalTensor x = LocalTensor::from_fn(world, [](int r) { return zeros({r == 2 ? 3 : 2}); });
    all_reduce(x, mesh, 0);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("[ranks 0-3] CommError: all_reduce over mesh dim 'dim 0'"), std::string::npos)
      << err;
  EXPECT_NE(err.find("inputs differ within the group"), std::string::npos) << err;
}

TEST(Launch, ALaunchErrorGivesExitCode2) {
  auto env = clean_env();
  Args args({"prog", "--spmd-backend=gloo"});
  ::testing::internal::CaptureStderr();
  bool ran = false;
  int code = launch(args.argc, args.pointers.data(), [&](World&) { ran = true; });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 2);
  EXPECT_FALSE(ran);
  EXPECT_EQ(err,
            "ConfigError: unknown backend 'gloo' (--spmd-backend=gloo); valid backends: sim, "
            "threads, mpi, nccl\n");
}

TEST(Launch, OtherExceptionsAreCaughtToo) {
  auto env = clean_env();
  Args args({"prog"});
  ::testing::internal::CaptureStderr();
  int code = launch(args.argc, args.pointers.data(), [](World&) { throw std::runtime_error("x"); });
  // A non-spmd exception is named by its C++ type.
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "[ranks 0-7] std::runtime_error: x\n");
  EXPECT_EQ(code, 1);
  ::testing::internal::CaptureStderr();
  code = launch(args.argc, args.pointers.data(), [](World&) { throw 42; });
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "[ranks 0-7] int: an exception that is not a std::exception\n");
  EXPECT_EQ(code, 1);
  ::testing::internal::CaptureStderr();
  code = launch(args.argc, args.pointers.data(), [](World&) { std::vector<int>().at(3); });
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("[ranks 0-7] std::out_of_range: "),
            std::string::npos);
  EXPECT_EQ(code, 1);
}

TEST(Launch, TraceFlagWritesChromeJsonAtTheEnd) {
  auto env = clean_env();
  const std::string path = ::testing::TempDir() + "/runtime_test_trace.json";
  std::remove(path.c_str());
  const std::string flag = "--spmd-trace=" + path;
  Args args({"prog", flag, "--spmd-world-size=2"});
  trace().clear();
  int code = launch(args.argc, args.pointers.data(), [](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2});
    all_reduce(LocalTensor::from_fn(world, [](int r) { return full({3}, r); }), mesh, 0);
  });
  EXPECT_EQ(code, 0);
  EXPECT_EQ(trace().capacity(), 0u);
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"all_reduce\""), std::string::npos);
  trace().set_capacity(Trace::kDefaultCapacity);
}

}  // namespace
}  // namespace spmd
