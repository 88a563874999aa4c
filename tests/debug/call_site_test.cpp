// Every report names the user's line (Note [User call sites], core/call_site.h): errors thrown
// inside a public call, the collectives a DTensor op issues, and the derivatives backward runs.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>

#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/debug/checks.h>
#include <spmd/dtensor/ops.h>
#include <spmd/dtensor/redistribute.h>
#include <spmd/world/local_ops.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

std::string here(int line) {
  return fmt::format("call_site_test.cpp:{}", line);
}

TEST(CallSite, AnErrorInsideAnOpEndsWithTheUsersLine) {
  World world = World::sim(2);
  DeviceMesh mesh = init_device_mesh(world, {2}, {"tp"});
  DTensor a = distribute_tensor(ones({4, 3}), mesh, {Shard{0}});
  DTensor b = distribute_tensor(ones({5, 3}), mesh, {Shard{0}});
  const int line = __LINE__ + 1;
  const std::string message = expect_throws<ShapeError>([&] { (void)matmul(a, b); });
  EXPECT_NE(message.find("(at " + here(line) + ")"), std::string::npos) << message;
  // Operators take the line through their At<DTensor> operand.
  const int op_line = __LINE__ + 1;
  const std::string plus = expect_throws<Error>([&] { (void)(a + b); });
  EXPECT_NE(plus.find("(at " + here(op_line) + ")"), std::string::npos) << plus;
}

TEST(CallSite, TheCollectivesOfAnOpAreTracedAtTheUsersLine) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  DTensor x = distribute_tensor(ones({8, 4}), mesh, {Shard{1}});
  DTensor w = distribute_tensor(ones({4, 2}), mesh, {Shard{0}});
  trace().clear();
  trace().set_enabled(true);
  const int matmul_line = __LINE__ + 1;
  DTensor y = matmul(x, w);  // Partial: no collective yet
  const int redistribute_line = __LINE__ + 1;
  DTensor r = y.redistribute({Replicate{}});
  const std::vector<TraceEvent> events = trace().events();
  trace().set_enabled(false);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(std::string(events[0].file).find("call_site_test.cpp") != std::string::npos, true)
      << events[0].file;
  EXPECT_EQ(events[0].line, static_cast<uint32_t>(redistribute_line));
  EXPECT_NE(matmul_line, redistribute_line);
}

TEST(CallSite, AnImplicitRedistributionIsTracedAtTheOpsLine) {
  World world = World::sim(4);
  DeviceMesh mesh = init_device_mesh(world, {4}, {"tp"});
  DTensor a = distribute_tensor(ones({8, 4}), mesh, {Shard{0}});
  DTensor b = distribute_tensor(ones({8, 4}), mesh, {Shard{1}});
  trace().clear();
  trace().set_enabled(true);
  const int line = __LINE__ + 1;
  DTensor c = a + b;  // one operand moves to the other's placements
  const std::vector<TraceEvent> events = trace().events();
  trace().set_enabled(false);
  ASSERT_FALSE(events.empty());
  for (const TraceEvent& event : events) {
    EXPECT_NE(std::string(event.file).find("call_site_test.cpp"), std::string::npos) << event.file;
    EXPECT_EQ(event.line, static_cast<uint32_t>(line));
  }
}

TEST(CallSite, BackwardNamesTheLineThatRecordedTheNode) {
  World world = World::sim(2);
  set_debug(world, {.nan = true});
  DeviceMesh mesh = init_device_mesh(world, {2}, {"tp"});
  DTensor x = distribute_tensor(zeros({4}), mesh, {Shard{0}});  // sqrt'(0) = inf
  x.requires_grad_();
  const int line = __LINE__ + 1;
  DTensor y = sqrt(x);
  DTensor loss = sum(y);
  const int backward_line = __LINE__ + 1;
  const std::string message = expect_throws<NonFiniteError>([&] { backward(loss); });
  EXPECT_NE(message.find("in the backward of 'sqrt' recorded at " + here(line)), std::string::npos)
      << message;
  EXPECT_EQ(message.find(here(backward_line)), std::string::npos) << message;
}

}  // namespace
}  // namespace spmd
