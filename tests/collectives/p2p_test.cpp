// tests/collectives/p2p_test.cpp: send, recv, isend/irecv and batch_isend_irecv (Note
// [Point-to-point] in collectives/types.h) under every backend: values against the sender's input,
// mismatches naming both lines, the FIFO pairing of Megatron-LM #5271, autograd through a
// transfer, and the errors only one backend can see (sim's recv before its send, threads' send
// cycle).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/testing.h>
#include <spmd/world/local_ops.h>
#include <spmd/world/local_tensor.h>

namespace spmd {
namespace {

// The ranks of `wanted` this world holds (all of them under sim, at most one under threads/mpi).
std::vector<int> held_of(const World& world, const std::vector<int>& wanted) {
  std::vector<int> out;
  for (int r : wanted) {
    for (int h : world.held_ranks()) {
      if (h == r) out.push_back(r);
    }
  }
  return out;
}

// Rank r's values: r * 100 + i, shape `shape`.
LocalTensor data_on(const std::vector<int>& ranks, const Shape& shape) {
  return LocalTensor::from_fn(ranks, [&](int r) {
    return arange(shape_numel(shape)).reshape(shape) + static_cast<double>(r * 100);
  });
}

std::vector<int> even_ranks(int n) {
  std::vector<int> out;
  for (int r = 0; r + 1 < n; r += 2) out.push_back(r);
  return out;
}
std::vector<int> odd_ranks(int n) {
  std::vector<int> out;
  for (int r = 1; r < n; r += 2) out.push_back(r);
  return out;
}

// Every even rank sends to the next odd rank (pairs of a mesh dim of size 2), as a pipeline of 2
// stages over dp pairs does.
SPMD_TEST(PointToPoint, SendRecvPairsAlongADim) {
  const int n = world.size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even world";
  DeviceMesh mesh = init_device_mesh(world, {n / 2, 2}, {"dp", "pp"});
  communicator(mesh, "pp");  // every process creates it (mpi: a split over every process)
  const std::vector<int> senders = held_of(world, even_ranks(n));
  const std::vector<int> receivers = held_of(world, odd_ranks(n));
  if (!senders.empty()) {
    LocalTensor token = send(data_on(senders, {3, 4}), mesh, "pp", /*dst=*/1, /*tag=*/5);
    for (int r : senders) EXPECT_EQ(token.shard(r).numel(), 0);
  }
  if (!receivers.empty()) {
    LocalTensor got = recv(data_on(receivers, {3, 4}) * 0.0, mesh, "pp", /*src=*/0, /*tag=*/5);
    for (int r : receivers) {
      EXPECT_TRUE(equal(got.shard(r), data_on({r - 1}, {3, 4}).shard(r - 1))) << "rank " << r;
    }
  }
}

// Both directions at once: NCCL's group semantics, so neither side waits for the other.
SPMD_TEST(PointToPoint, BatchIsendIrecvExchangesBothWays) {
  const int n = world.size();
  if (n < 2) GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {n}, {"x"});
  communicator(mesh, "x");
  // Ranks 0 and 1 swap their tensors; the others do nothing.
  std::vector<P2POp> ops;
  for (int me : held_of(world, {0, 1})) {
    const int other = 1 - me;
    ops.push_back(P2POp{P2POp::Kind::Send, data_on({me}, {5}), other, 0});
    ops.push_back(P2POp{P2POp::Kind::Recv, data_on({me}, {5}), other, 0});
    // Under sim the ops of both ranks are one batch per rank: issue rank 0's, then rank 1's.
    if (world.backend_name() == "sim" && me == 0) continue;
    std::vector<Async<LocalTensor>> handles = batch_isend_irecv(ops, mesh, "x");
    std::vector<LocalTensor> results;
    for (auto& h : handles) results.push_back(h.wait());
    // The recvs are the odd entries, in ops order.
    for (size_t k = 1; k < ops.size(); k += 2) {
      const int r = ops[k].tensor.ranks()[0];
      EXPECT_TRUE(equal(results[k].shard(r), data_on({1 - r}, {5}).shard(1 - r))) << "rank " << r;
    }
    ops.clear();
  }
}

// The tag is checked, not used for pairing: the report names both lines.
SPMD_TEST(PointToPoint, TagMismatchNamesBothLines) {
  if (world.size() < 2) GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"x"});
  communicator(mesh, "x");
  for (int r : held_of(world, {0})) {
    try {
      send(data_on({r}, {4}), mesh, "x", 1, /*tag=*/1);  // SEND-LINE
    } catch (const CollectiveMismatchError&) {
      // threads: both sides of the failed transfer throw; mpi, sim: only the receiver.
    }
  }
  for (int r : held_of(world, {1})) {
    testing::expect_throws<CollectiveMismatchError>(
        [&] { recv(data_on({r}, {4}), mesh, "x", 0, /*tag=*/2); },
        {"point-to-point mismatch", "they differ in tag", "tag=1", "tag=2", "p2p_test.cpp:"});
  }
}

// Megatron-LM #5271: two shapes sent in one order and received in the other. NCCL would pair them
// silently; here the first pairing fails and the report says the next message fits.
SPMD_TEST(PointToPoint, FifoSwapIsReported) {
  if (world.size() < 2) GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"x"});
  communicator(mesh, "x");
  std::vector<Async<LocalTensor>> pending;
  for (int r : held_of(world, {0})) {
    pending.push_back(isend(data_on({r}, {2, 8}), mesh, "x", 1));
    pending.push_back(isend(data_on({r}, {2, 4}), mesh, "x", 1));
  }
  for (int r : held_of(world, {1})) {
    testing::expect_throws<CollectiveMismatchError>(
        [&] {
          recv(data_on({r}, {2, 4}), mesh, "x", 0);
        },
        {"they differ in shape", "fits this recv", "#5271"});
    if (world.backend_name() == "sim") {
      // The message that fits is still queued (threads ended that rendezvous; mpi read its
      // envelope for the report).
      recv(data_on({r}, {2, 4}), mesh, "x", 0);
    }
  }
  for (auto& p : pending) {
    try {
      p.wait();
    } catch (const CollectiveMismatchError&) {
    }
  }
}

// Autograd through a transfer: rank 0 sends 2x, rank 1 computes sum(z^2); backward on rank 1
// sends dz = 2z back, backward(token) on rank 0 receives it: dx = 2 * 2 * 2x = 8x.
SPMD_TEST(PointToPoint, GradientFlowsBackThroughSendAndRecv) {
  if (world.size() < 2) GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"x"});
  communicator(mesh, "x");
  LocalTensor x;
  LocalTensor token;
  for (int r : held_of(world, {0})) {
    x = data_on({r}, {3});
    x.requires_grad_(true);
    token = send(x * 2.0, mesh, "x", 1);
  }
  for (int r : held_of(world, {1})) {
    LocalTensor z = recv(data_on({r}, {3}), mesh, "x", 0);
    EXPECT_TRUE(z.requires_grad());
    backward(sum(z * z));
  }
  if (x.defined()) {
    backward(token);
    EXPECT_TRUE(allclose(x.grad().shard(0), x.detach().shard(0) * 8.0));
  }
}

// A stage that receives microbatch 2 where 1 was due, with the right shape: only the pipeline
// context (Note [Pipeline context]) tells them apart.
SPMD_TEST(PointToPoint, WrongMicrobatchIsReported) {
  if (world.size() < 2) GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"x"});
  communicator(mesh, "x");
  std::vector<Async<LocalTensor>> pending;
  for (int r : held_of(world, {0})) {
    const PipelineContextScope scope(0, 2);
    pending.push_back(isend(data_on({r}, {4}), mesh, "x", 1));
  }
  for (int r : held_of(world, {1})) {
    const PipelineContextScope scope(1, 1);
    testing::expect_throws<CollectiveMismatchError>(
        [&] { recv(data_on({r}, {4}), mesh, "x", 0); },
        {"they differ in microbatch", "stage 1 receives microbatch 2 where microbatch 1 was due"});
  }
  for (auto& p : pending) {
    try {
      p.wait();
    } catch (const CollectiveMismatchError&) {
    }
  }
}

SPMD_TEST(PointToPoint, BadPeersAreCommErrors) {
  if (world.size() < 2) GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"x"});
  communicator(mesh, "x");
  for (int r : held_of(world, {0})) {
    testing::expect_throws<CommError>([&] { send(data_on({r}, {4}), mesh, "x", 0); },
                                      {"send over mesh dim 'x'", "is the rank itself"});
    testing::expect_throws<CommError>([&] { recv(data_on({r}, {4}), mesh, "x", world.size()); },
                                      {"peer=", "is not a group rank"});
  }
}

// ---- what only one backend can see ------------------------------------------------------------

// Two ranks that both send before they receive: NCCL's sends wait for their recvs, so on GPUs this
// hangs. threads models that and reports the cycle; sim and mpi (eager small messages) complete it.
SPMD_TEST(PointToPoint, SendCycleIsADeadlockOnThreads) {
  if (world.size() < 2) GTEST_SKIP();
  DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"x"});
  communicator(mesh, "x");
  const std::vector<int> pair = held_of(world, {0, 1});
  if (pair.empty()) return;
  auto exchange = [&] {
    for (int r : pair) send(data_on({r}, {4}), mesh, "x", 1 - r);
    for (int r : pair) {
      LocalTensor got = recv(data_on({r}, {4}), mesh, "x", 1 - r);
      EXPECT_TRUE(equal(got.shard(r), data_on({1 - r}, {4}).shard(1 - r)));
    }
  };
  if (world.backend_name() == "threads") {
    testing::expect_throws<DeadlockError>(exchange, {"deadlock", "send over 'x'"});
  } else {
    exchange();
  }
}

TEST(PointToPointSim, RecvBeforeItsSendIsAnError) {
  World world = World::sim(2);
  DeviceMesh mesh = init_device_mesh(world, {2}, {"pp"});
  testing::expect_throws<CommError>(
      [&] { recv(data_on({1}, {4}), mesh, "pp", 0); },
      {"rank 0 has sent nothing to rank 1", "a send must come before its recv"});
}

TEST(PointToPointSim, SendNeverReceivedIsAnErrorAtTheEnd) {
  World world = World::sim(2);
  DeviceMesh mesh = init_device_mesh(world, {2}, {"pp"});
  send(data_on({0}, {4}), mesh, "pp", 1, 3);
  testing::expect_throws<CommError>([&] { world.backend().finish_program(); },
                                    {"1 point-to-point send nobody received", "tag=3"});
}

}  // namespace
}  // namespace spmd
