// The threads backend: results equal to sim's, communicators that meet across rank threads, and
// every kind of mismatch (op, shape, dtype, reduce op, group, root, split sizes, order, a missing
// call, an early exit, a rank that throws) reported in every rank concerned, with its type, the
// ranks and the source lines, and within a second (Note [Threads deadlock detection]).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include <spmd/backends/threads/backend.h>
#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/dtensor/ops.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/runtime/digest.h>
#include <spmd/runtime/launch.h>
#include <spmd/tensor/random.h>
#include <spmd/world/local_ops.h>

namespace spmd {
namespace {

using Site = std::source_location;

std::vector<RankOutcome> run(int n, const std::function<void(World&)>& program) {
  LaunchOptions options;
  options.backend = "threads";
  options.world_size = n;
  return run_rank_threads(options, [&](World& world) {
    program(world);
    return 0;
  });
}

// "backend_test.cpp:42"
std::string at(const Site& site) {
  return fmt::format("backend_test.cpp:{}", site.line());
}

// The rank's error message if it threw exactly E (DeadlockError is not taken for its base), else a
// test failure and "".
template <class E>
std::string error_of(const RankOutcome& outcome) {
  if (!outcome.error) {
    ADD_FAILURE() << "rank " << outcome.rank << " did not fail";
    return "";
  }
  try {
    std::rethrow_exception(outcome.error);
  } catch (const E& e) {
    if constexpr (!std::is_same_v<E, DeadlockError>) {
      if (dynamic_cast<const DeadlockError*>(&e) != nullptr) {
        ADD_FAILURE() << "rank " << outcome.rank << " threw a DeadlockError: " << e.what();
      }
    }
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << outcome.rank << " threw the wrong type: " << e.what();
  }
  return "";
}

// Every rank of `ranks` failed with E and its message contains every fragment.
template <class E>
void expect_failed(const std::vector<RankOutcome>& outcomes, const std::vector<int>& ranks,
                   const std::vector<std::string>& fragments) {
  for (int r : ranks) {
    const std::string message = error_of<E>(outcomes[static_cast<size_t>(r)]);
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "rank " << r << "'s report lacks '" << fragment << "':\n"
          << message;
    }
  }
}

void expect_succeeded(const std::vector<RankOutcome>& outcomes, const std::vector<int>& ranks) {
  for (int r : ranks) {
    const RankOutcome& o = outcomes[static_cast<size_t>(r)];
    EXPECT_FALSE(o.error) << "rank " << r << ": " << (o.error ? error_text(o.error) : "");
  }
}

int rank_of(const World& world) {
  return world.held_ranks().front();
}

LocalTensor ranked(const World& world, const Shape& shape, DType dtype = DType::F32) {
  return LocalTensor::from_fn(world, [&](int r) { return full(shape, r + 1.0, dtype); });
}
// The same without SPMD types (the rank-list form): for the tests that reduce a result again to
// exercise the rendezvous, which types would report as a doubled reduction.
LocalTensor ranked_untyped(const World& world, const Shape& shape) {
  return LocalTensor::from_fn(world.held_ranks(), [&](int r) { return full(shape, r + 1.0); });
}

// ---- results ---------------------------------------------------------------------------------

// A program touching every collective, a 2-D mesh, sub-meshes and DTensor redistribution, whose
// digest must be the same under threads as under sim.
uint64_t tour(World& world) {
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  LocalTensor x = LocalTensor::from_fn(world, [](int r) {
    return (arange(8) + 10.0 * r).reshape({4, 2});
  });
  std::vector<LocalTensor> out;
  out.push_back(all_reduce(x, mesh, "tp"));
  out.push_back(all_reduce(x, mesh, "dp", ReduceOp::Avg));
  out.push_back(all_gather(x, mesh, "tp", 1));
  out.push_back(reduce_scatter(x, mesh, "dp", ReduceOp::Max));
  out.push_back(all_to_all(x, mesh, "tp", 0, 1));
  out.push_back(broadcast(x, mesh, "dp", 1));
  out.push_back(scatter(x, mesh, "tp", 1));
  out.push_back(gather(x, mesh, "tp", 1));
  out.push_back(reduce(x, mesh, "dp", ReduceOp::Sum, 0));
  out.push_back(permute(x, mesh, "tp", {1, 0}));
  out.push_back(all_reduce(x, mesh[{"dp", "tp"}].flatten("all"), "all"));
  PerRank<std::vector<int64_t>> splits = mesh.local_rank("tp").map([](int64_t i) {
    return i == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{3, 1};
  });
  PerRank<std::vector<int64_t>> receives = mesh.local_rank("tp").map([](int64_t i) {
    return i == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{3, 1};
  });
  out.push_back(all_to_all_single(x, mesh, "tp", receives, splits));
  Async<LocalTensor> pending = all_reduce_async(x, mesh, "dp");
  out.push_back(pending.wait());
  barrier(mesh);
  DTensor w = distribute_tensor(randn({8, 6}, 3), mesh, {Replicate{}, Shard{1}});
  DTensor a = distribute_tensor(randn({4, 8}, 4), mesh, {Shard{0}, Replicate{}});
  DTensor y = matmul(a, w).redistribute({Replicate{}, Replicate{}});
  out.push_back(y.to_local());
  return digest(world, out);
}

TEST(ThreadsBackend, ResultsEqualSimBitForBit) {
  World sim = World::sim(4);
  const uint64_t expected = tour(sim);
  std::vector<uint64_t> digests(4);
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    EXPECT_EQ(world.backend_name(), "threads");
    EXPECT_EQ(world.held_ranks().size(), 1u);
    EXPECT_EQ(world.is_coordinator(), rank_of(world) == 0);
    digests[static_cast<size_t>(rank_of(world))] = tour(world);
  });
  expect_succeeded(outcomes, {0, 1, 2, 3});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(digests[static_cast<size_t>(r)], expected) << "rank " << r;
}

TEST(ThreadsBackend, OneRankAndManyRanks) {
  for (int n : {1, 3, 16}) {
    std::vector<double> sums(static_cast<size_t>(n));
    std::vector<RankOutcome> outcomes = run(n, [&](World& world) {
      DeviceMesh mesh = init_device_mesh(world, {n}, {"x"});
      LocalTensor y = all_reduce(ranked(world, {3}), mesh, "x");
      sums[static_cast<size_t>(rank_of(world))] = y.shard(rank_of(world)).to_vector<double>()[0];
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_FALSE(outcomes[static_cast<size_t>(r)].error);
      EXPECT_EQ(sums[static_cast<size_t>(r)], n * (n + 1) / 2.0) << "n " << n << " rank " << r;
    }
  }
}

TEST(ThreadsBackend, MeshesBuiltSeparatelyMeetByTheirGroups) {
  std::vector<double> sums(4);
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    const int r = rank_of(world);
    // Rank 0 builds its mesh twice and alternates; the odd ranks build it from rank ids; each
    // rank also builds a one-group mesh of just its pair (as torch's new_group would).
    DeviceMesh a = init_device_mesh(world, {2, 2}, {"dp", "tp"});
    DeviceMesh b = r % 2 ? DeviceMesh::from_ranks(world, {2, 2}, {0, 1, 2, 3}, {"p", "q"})
                         : init_device_mesh(world, {2, 2}, {"dp", "tp"});
    LocalTensor x = ranked_untyped(world, {2});
    LocalTensor y = all_reduce(x, a, 1);
    y = all_reduce(y, b, 1);
    y = all_reduce(y, a, 1);
    const int64_t first = r / 2 * 2;
    DeviceMesh pair = DeviceMesh::from_ranks(world, {2}, {first, first + 1}, {"pair"});
    y = all_reduce(y, pair, "pair");
    sums[static_cast<size_t>(r)] = y.shard(r).to_vector<double>()[0];
  });
  expect_succeeded(outcomes, {0, 1, 2, 3});
  // Pair sums: ranks 0, 1 hold 1 and 2 (sum 3), ranks 2, 3 hold 3 and 4 (sum 7); four doublings.
  EXPECT_EQ(sums, (std::vector<double>{3 * 8, 3 * 8, 7 * 8, 7 * 8}));
}

// The trace's sequence numbers count per mesh universe, as under sim and mpi: a second world mesh
// built after the first numbers its groups' collectives from 0 again, so `spmd trace diff` finds
// a threads trace equal to sim's (the calls still meet through one rendezvous per group family).
TEST(ThreadsBackend, EachMeshNumbersItsCollectivesFromZeroAsUnderSim) {
  auto program = [](World& world) {
    DeviceMesh a = init_device_mesh(world, {2, 2}, {"dp", "tp"});
    LocalTensor x = ranked_untyped(world, {2});
    x = all_reduce(all_reduce(x, a, "tp"), a, "tp");
    DeviceMesh b = init_device_mesh(world, {2, 2}, {"dp", "tp"});
    x = all_reduce(all_reduce(x, b, "tp"), a, "tp");
    x = all_reduce(x, b, "dp");
  };
  // Rank `r`'s (dim, sequence) pairs in trace order.
  auto sequences = [](int r) {
    std::vector<std::string> out;
    for (const TraceRecord& t : trace().records()) {
      if (t.rank == r) out.push_back(fmt::format("{}#{}", t.dim_name, t.sequence));
    }
    return out;
  };
  const std::vector<std::string> want = {"tp#0", "tp#1", "tp#0", "tp#2", "dp#0"};
  trace().clear();
  World sim = World::sim(4);
  program(sim);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(sequences(r), want) << "sim, rank " << r;
  trace().clear();
  expect_succeeded(run(4, program), {0, 1, 2, 3});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(sequences(r), want) << "threads, rank " << r;
  trace().clear();
}

// Note [Traces of rank threads]: each rank thread reads and clears its own trace (one rank's
// clear() once wiped every rank's); after the run the process trace holds every rank's.
TEST(ThreadsBackend, EachRankThreadHasItsOwnTrace) {
  trace().clear();
  std::vector<size_t> seen(4);
  expect_succeeded(run(4,
                       [&](World& world) {
                         const int r = rank_of(world);
                         DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
                         (void)all_reduce(ranked(world, {2}), mesh, "x");
                         if (r == 0) trace().clear();  // rank 0 only
                         (void)all_gather(ranked(world, {2}), mesh, "x");
                         barrier(mesh);  // every rank has recorded both before anyone reads
                         seen[static_cast<size_t>(r)] = trace().records().size();
                         for (const TraceRecord& t : trace().records()) EXPECT_EQ(t.rank, r);
                       }),
                   {0, 1, 2, 3});
  // Rank 0 cleared its own all_reduce; the others keep theirs (and the barrier is in every trace).
  EXPECT_EQ(seen, (std::vector<size_t>{2, 3, 3, 3}));
  std::vector<int> per_rank(4, 0);
  for (const TraceRecord& t : trace().records()) ++per_rank[static_cast<size_t>(t.rank)];
  EXPECT_EQ(per_rank, (std::vector<int>{2, 3, 3, 3}));
  trace().clear();
}

TEST(ThreadsBackend, AsyncCallsAndRankSpecificControlFlow) {
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    const int r = rank_of(world);
    DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
    Async<LocalTensor> first = all_reduce_async(ranked(world, {2}), mesh, "x");
    // Rank-specific branches are fine as long as the collectives agree.
    LocalTensor second;
    if (r == 0) {
      second = broadcast(ranked(world, {2}), mesh, "x", 0);
    } else {
      second = broadcast(ranked(world, {2}) * 2.0, mesh, "x", 0);
    }
    EXPECT_EQ(first.wait().shard(r).to_vector<double>(), (std::vector<double>{10, 10}));
    EXPECT_TRUE(first.ready());
    EXPECT_EQ(second.shard(r).to_vector<double>(), (std::vector<double>{1, 1}));
  });
  expect_succeeded(outcomes, {0, 1, 2, 3});
}

// Large results are copied over the thread pool, which one rank thread at a time may use (the
// others run inline), and come from the caching allocator that every rank thread shares.
TEST(ThreadsBackend, LargeTensorsFromSeveralRankThreads) {
  constexpr int64_t kRows = 1 << 20;  // 4 MiB per rank, 16 MiB gathered
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    const int r = rank_of(world);
    DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
    for (int round = 0; round < 3; ++round) {
      LocalTensor g = all_gather(ranked(world, {kRows}) * 2.0, mesh, "x");
      const Tensor& t = g.shard(r);
      ASSERT_EQ(t.numel(), 4 * kRows);
      for (int64_t k = 0; k < 4; ++k) {
        EXPECT_EQ(t.narrow(0, k * kRows + kRows - 1, 1).to_vector<double>()[0], 2.0 * (k + 1));
      }
    }
  });
  expect_succeeded(outcomes, {0, 1, 2, 3});
}

// A replicated result is one buffer shared by the rank threads (Note [Copy-on-write replicas]):
// a rank that writes to its shard gets its own copy first, and the others keep the sum.
TEST(ThreadsBackend, WritingASharedResultCopiesItFirst) {
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    const int r = rank_of(world);
    DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
    for (int round = 0; round < 20; ++round) {
      LocalTensor y = all_reduce(ranked(world, {1 << 12}), mesh, "x");
      EXPECT_EQ(y.shard(r).to_vector<double>()[7], 10.0);
      y.mutable_shard(r).fill_(r);
      EXPECT_EQ(y.shard(r).to_vector<double>()[7], r);
    }
  });
  expect_succeeded(outcomes, {0, 1, 2, 3});
}

TEST(ThreadsBackend, WorldsExistOnlyOnRankThreads) {
  LaunchOptions options;
  options.backend = "threads";
  EXPECT_THROW(make_world(options), ConfigError);
  std::vector<RankOutcome> outcomes =
      run(2, [&](World& world) { EXPECT_TRUE(make_world(options) == world); });
  expect_succeeded(outcomes, {0, 1});
}

// ---- mismatches: every rank of the group gets CollectiveMismatchError -----------------------

TEST(ThreadsMismatch, Op) {
  const Site reduce_site = Site::current();
  const Site gather_site = Site::current();
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
    LocalTensor x = ranked(world, {4});
    if (rank_of(world) == 1) {
      all_gather(x, mesh, "x", 0, gather_site);
    } else {
      all_reduce(x, mesh, "x", ReduceOp::Sum, reduce_site);
    }
  });
  expect_failed<CollectiveMismatchError>(
      outcomes, {0, 1, 2, 3},
      {"call #0 of group ranks [0, 1, 2, 3] over mesh dim 'x'", "differ in op",
       "rank 0: all_reduce over 'x' [4] f32 op=sum at " + at(reduce_site),
       "rank 1: all_gather over 'x' [4] f32 gather_dim=0 at " + at(gather_site),
       "rank 2:", "rank 3:"});
}

TEST(ThreadsMismatch, Shape) {
  const Site site = Site::current();
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
    all_reduce(ranked(world, {rank_of(world) == 2 ? 5 : 4}), mesh, "x", ReduceOp::Sum, site);
  });
  expect_failed<CollectiveMismatchError>(
      outcomes, {0, 1, 2, 3},
      {"differ in shape", "rank 0: all_reduce over 'x' [4]",
       "rank 2: all_reduce over 'x' [5] f32 op=sum at " + at(site), "rank 1:", "rank 3:"});
}

TEST(ThreadsMismatch, Dtype) {
  const Site site = Site::current();
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
    const DType dtype = rank_of(world) == 3 ? DType::I32 : DType::F32;
    all_reduce(ranked(world, {4}, dtype), mesh, "x", ReduceOp::Sum, site);
  });
  expect_failed<CollectiveMismatchError>(
      outcomes, {0, 1, 2, 3},
      {"differ in dtype", "rank 3: all_reduce over 'x' [4] i32 op=sum at " + at(site),
       "rank 0: all_reduce over 'x' [4] f32", "rank 1:", "rank 2:"});
}

TEST(ThreadsMismatch, ReduceOp) {
  const Site site = Site::current();
  std::vector<RankOutcome> outcomes = run(2, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2}, {"x"});
    all_reduce(ranked(world, {4}), mesh, "x", rank_of(world) ? ReduceOp::Max : ReduceOp::Sum, site);
  });
  expect_failed<CollectiveMismatchError>(
      outcomes, {0, 1},
      {"differ in reduce op", "rank 0: all_reduce over 'x' [4] f32 op=sum",
       "rank 1: all_reduce over 'x' [4] f32 op=max at " + at(site)});
}

TEST(ThreadsMismatch, Root) {
  const Site site = Site::current();
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"a", "b"});
    // Group [2, 3] of dim b disagrees on the root; group [0, 1] agrees and completes.
    broadcast(ranked(world, {4}), mesh, "b", rank_of(world) == 3 ? 1 : 0, site);
  });
  expect_succeeded(outcomes, {0, 1});
  expect_failed<CollectiveMismatchError>(
      outcomes, {2, 3},
      {"call #0 of group ranks [2, 3] over mesh dim 'b'", "differ in root (src)",
       "rank 2: broadcast over 'b' [4] f32 src=0 at " + at(site),
       "rank 3: broadcast over 'b' [4] f32 src=1 at " + at(site)});
}

TEST(ThreadsMismatch, SplitSizes) {
  const Site site = Site::current();
  std::vector<RankOutcome> outcomes = run(2, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2}, {"x"});
    const int r = rank_of(world);
    // Rank 0 sends 1 row to rank 1, but rank 1 expects 2 from rank 0.
    PerRank<std::vector<int64_t>> in =
        r == 0 ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{1, 2};
    PerRank<std::vector<int64_t>> out =
        r == 0 ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{2, 2};
    all_to_all_single(ranked(world, {3, 2}), mesh, "x", out, in, site);
  });
  expect_failed<CollectiveMismatchError>(
      outcomes, {0, 1},
      {"differ in split sizes", "rank 0: all_to_all_single over 'x' [3, 2] f32",
       "rank 1: all_to_all_single over 'x' [3, 2] f32", at(site),
       "rank 0 sends 1 rows to rank 1 (in_splits [2, 1]), which expects 2 (out_splits [2, 2])"});
}

TEST(ThreadsMismatch, OrderWithinAGroup) {
  const Site reduce_site = Site::current();
  const Site gather_site = Site::current();
  std::vector<RankOutcome> outcomes = run(2, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2}, {"x"});
    LocalTensor x = ranked(world, {2});
    if (rank_of(world) == 0) {
      all_reduce(x, mesh, "x", ReduceOp::Sum, reduce_site);
      all_gather(x, mesh, "x", 0, gather_site);
    } else {
      all_gather(x, mesh, "x", 0, gather_site);
      all_reduce(x, mesh, "x", ReduceOp::Sum, reduce_site);
    }
  });
  expect_failed<CollectiveMismatchError>(
      outcomes, {0, 1},
      {"call #0 of group ranks [0, 1]", "differ in op",
       "rank 0: all_reduce over 'x' [2] f32 op=sum at " + at(reduce_site),
       "rank 1: all_gather over 'x' [2] f32 gather_dim=0 at " + at(gather_site)});
}

// ---- calls that can never complete: DeadlockError in every waiting rank ---------------------

TEST(ThreadsDeadlock, OrderAcrossGroupsIsACycle) {
  const Site a_site = Site::current();
  const Site b_site = Site::current();
  const auto start = std::chrono::steady_clock::now();
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"a", "b"});
    LocalTensor x = ranked(world, {2});
    // a groups [0, 2], [1, 3]; b groups [0, 1], [2, 3]. Ranks 0 and 3 go a then b, ranks 1 and
    // 2 b then a: each waits for a rank that waits for another, around the square.
    const int r = rank_of(world);
    if (r == 0 || r == 3) {
      all_reduce(x, mesh, "a", ReduceOp::Sum, a_site);
      all_reduce(x, mesh, "b", ReduceOp::Sum, b_site);
    } else {
      all_reduce(x, mesh, "b", ReduceOp::Sum, b_site);
      all_reduce(x, mesh, "a", ReduceOp::Sum, a_site);
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);
  expect_failed<DeadlockError>(
      outcomes, {0, 1, 2, 3},
      {"deadlock: every rank that has not finished waits",
       "rank 0: waits in all_reduce over 'a' [2] f32 op=sum at " + at(a_site) +
           " (call #0 of group ranks [0, 2]), which lacks rank 2",
       "rank 1: waits in all_reduce over 'b' [2] f32 op=sum at " + at(b_site) +
           " (call #0 of group ranks [0, 1]), which lacks rank 0",
       "rank 2: waits in all_reduce over 'b'", "rank 3: waits in all_reduce over 'a'"});
}

TEST(ThreadsDeadlock, Group) {
  const Site a_site = Site::current();
  const Site b_site = Site::current();
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"a", "b"});
    // Rank 2 reduces over a (group [0, 2]) where its b peer, rank 3, reduces over b ([2, 3]).
    if (rank_of(world) == 2) {
      all_reduce(ranked(world, {2}), mesh, "a", ReduceOp::Sum, a_site);
    } else {
      all_reduce(ranked(world, {2}), mesh, "b", ReduceOp::Sum, b_site);
    }
  });
  expect_succeeded(outcomes, {0, 1});
  expect_failed<DeadlockError>(
      outcomes, {2},
      {"call #0 of group ranks [0, 2] over mesh dim 'a' can never complete: rank 0 has finished "
       "(returned) without making it",
       "rank 2: all_reduce over 'a' [2] f32 op=sum at " + at(a_site)});
  expect_failed<DeadlockError>(
      outcomes, {3},
      {"call #0 of group ranks [2, 3] over mesh dim 'b' can never complete: rank 2 has finished "
       "(threw DeadlockError) without making it",
       "rank 3: all_reduce over 'b' [2] f32 op=sum at " + at(b_site),
       "rank 2: finished (threw DeadlockError); its last collective: all_reduce over 'a' [2] f32 "
       "op=sum at " +
           at(a_site)});
}

TEST(ThreadsDeadlock, MissingCall) {
  const Site skipped = Site::current();
  const Site next = Site::current();
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
    LocalTensor x = ranked(world, {2});
    // Rank 1 skips the first all_reduce; its second meets the others' first (same op and
    // shape, so nothing differs), and the others' second lacks rank 1, which has returned.
    if (rank_of(world) != 1) all_reduce(x, mesh, "x", ReduceOp::Sum, skipped);
    all_reduce(x, mesh, "x", ReduceOp::Sum, next);
  });
  expect_succeeded(outcomes, {1});
  expect_failed<DeadlockError>(
      outcomes, {0, 2, 3},
      {"call #1 of group ranks [0, 1, 2, 3] over mesh dim 'x' can never complete: rank 1 has "
       "finished (returned) without making it",
       "rank 0: all_reduce over 'x' [2] f32 op=sum at " + at(next),
       "rank 1: finished (returned); its last collective: all_reduce over 'x' [2] f32 op=sum at " +
           at(next) + " (call #0 of group ranks [0, 1, 2, 3])",
       "note: on this group, call #0 (ranks 0,2,3 at " + at(skipped) + "; rank 1 at " + at(next) +
           ") matched calls from different source lines"});
}

TEST(ThreadsDeadlock, EarlyExitWithinASecond) {
  const Site site = Site::current();
  const auto start = std::chrono::steady_clock::now();
  std::vector<RankOutcome> outcomes = run(4, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {4}, {"x"});
    if (rank_of(world) == 2) return;
    all_reduce(ranked(world, {2}), mesh, "x", ReduceOp::Sum, site);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);
  expect_succeeded(outcomes, {2});
  expect_failed<DeadlockError>(
      outcomes, {0, 1, 3},
      {"can never complete: rank 2 has finished (returned) without making it",
       "rank 2: finished (returned); it made no collective call",
       "rank 0: all_reduce over 'x' [2] f32 op=sum at " + at(site), "rank 1: all_reduce",
       "rank 3: all_reduce"});
}

TEST(ThreadsDeadlock, ARankThatThrows) {
  const Site site = Site::current();
  std::vector<RankOutcome> outcomes = run(3, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {3}, {"x"});
    if (rank_of(world) == 1) throw_error<ShapeError>("rank 1 fails on purpose");
    barrier(mesh, site);
  });
  EXPECT_EQ(error_text(outcomes[1].error), "ShapeError: rank 1 fails on purpose");
  expect_failed<DeadlockError>(
      outcomes, {0, 2},
      {"barrier over 'all'", "rank 1 has finished (threw ShapeError) without making it", at(site)});
}

TEST(ThreadsDeadlock, AnAsyncCallThatIsNeverMatched) {
  std::vector<RankOutcome> outcomes = run(2, [&](World& world) {
    DeviceMesh mesh = init_device_mesh(world, {2}, {"x"});
    if (rank_of(world) == 0) {
      Async<LocalTensor> pending = all_reduce_async(ranked(world, {2}), mesh, "x");
      pending.wait();
    }
  });
  expect_succeeded(outcomes, {1});
  expect_failed<DeadlockError>(outcomes, {0}, {"rank 1 has finished (returned) without making it"});
}

}  // namespace
}  // namespace spmd
