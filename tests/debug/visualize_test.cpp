// visualize_sharding (debug/visualize.h): exact drawings with colour off, for 1-D and 2-D tensors,
// even and uneven, replicated and partial.
#include <gtest/gtest.h>

#include <string>

#include <spmd/debug/visualize.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/ops/ops.h>

namespace spmd {
namespace {

class Visualize : public ::testing::Test {
 protected:
  std::string draw(const Shape& shape, const DeviceMesh& mesh, const Placements& placements) {
    return visualize_sharding(distribute_tensor(zeros(shape), mesh, placements),
                              {.color = VisualizeOptions::Color::Never});
  }
  World world_ = World::sim(4);
  DeviceMesh mesh_ = init_device_mesh(world_, {2, 2}, {"dp", "tp"});
  DeviceMesh line_ = init_device_mesh(world_, {4}, {"tp"});
};

TEST_F(Visualize, OneDimEven) {
  EXPECT_EQ(draw({8}, line_, {Shard{0}}),
            "DTensor [8] f32, S(0) on DeviceMesh((tp=4), stride=(1,))\n"
            "0      2      4      6      8\n"
            "┌──────┬──────┬──────┬──────┐\n"
            "│  0   │  1   │  2   │  3   │\n"
            "└──────┴──────┴──────┴──────┘");
}

TEST_F(Visualize, OneDimUnevenWithAnEmptyPiece) {
  EXPECT_EQ(draw({5}, line_, {Shard{0}}),
            "DTensor [5] f32, S(0) on DeviceMesh((tp=4), stride=(1,))\n"
            "0          2          4     5\n"
            "┌──────────┬──────────┬─────┐\n"
            "│    0     │    1     │  2  │\n"
            "└──────────┴──────────┴─────┘\n"
            "empty: rank 3 holds no elements [5:5]");
  // Nested: the outer mesh dim splits 3 | 2, the inner one 2 | 1 and 1 | 1.
  EXPECT_EQ(draw({5}, mesh_, {Shard{0}, Shard{0}}),
            "DTensor [5] f32, S(0),S(0) on DeviceMesh((dp=2, tp=2), stride=(2, 1))\n"
            "0          2     3     4     5\n"
            "┌──────────┬─────┬─────┬─────┐\n"
            "│    0     │  1  │  2  │  3  │\n"
            "└──────────┴─────┴─────┴─────┘");
}

TEST_F(Visualize, TwoDimEven) {
  EXPECT_EQ(draw({4, 4}, mesh_, {Shard{0}, Shard{1}}),
            "DTensor [4, 4] f32, S(0),S(1) on DeviceMesh((dp=2, tp=2), stride=(2, 1))\n"
            "  0            2            4\n"
            "0 ┌────────────┬────────────┐\n"
            "  │     0      │     1      │\n"
            "  │            │            │\n"
            "2 ├────────────┼────────────┤\n"
            "  │     2      │     3      │\n"
            "  │            │            │\n"
            "4 └────────────┴────────────┘");
}

TEST_F(Visualize, TwoDimUnevenToScale) {
  EXPECT_EQ(draw({5, 6}, mesh_, {Shard{0}, Shard{1}}),
            "DTensor [5, 6] f32, S(0),S(1) on DeviceMesh((dp=2, tp=2), stride=(2, 1))\n"
            "  0            3            6\n"
            "0 ┌────────────┬────────────┐\n"
            "  │            │            │\n"
            "  │     0      │     1      │\n"
            "  │            │            │\n"
            "3 ├────────────┼────────────┤\n"
            "  │     2      │     3      │\n"
            "  │            │            │\n"
            "5 └────────────┴────────────┘");
  EXPECT_EQ(draw({6, 5}, mesh_, {Shard{1}, Shard{0}}),
            "DTensor [6, 5] f32, S(1),S(0) on DeviceMesh((dp=2, tp=2), stride=(2, 1))\n"
            "  0               3          5\n"
            "0 ┌───────────────┬──────────┐\n"
            "  │               │          │\n"
            "  │       0       │    2     │\n"
            "  │               │          │\n"
            "3 ├───────────────┼──────────┤\n"
            "  │               │          │\n"
            "  │       1       │    3     │\n"
            "  │               │          │\n"
            "6 └───────────────┴──────────┘");
  EXPECT_EQ(draw({3, 2}, line_, {Shard{0}}),
            "DTensor [3, 2] f32, S(0) on DeviceMesh((tp=4), stride=(1,))\n"
            "  0                        2\n"
            "0 ┌────────────────────────┐\n"
            "  │           0            │\n"
            "1 ├────────────────────────┤\n"
            "  │           1            │\n"
            "2 ├────────────────────────┤\n"
            "  │           2            │\n"
            "3 └────────────────────────┘\n"
            "empty: rank 3 holds no elements [3:3, 0:2]");
}

TEST_F(Visualize, ReplicatedBlocksListEveryRank) {
  EXPECT_EQ(draw({2, 3}, mesh_, {Replicate{}, Replicate{}}),
            "DTensor [2, 3] f32, R,R on DeviceMesh((dp=2, tp=2), stride=(2, 1))\n"
            "  0                        3\n"
            "0 ┌────────────────────────┐\n"
            "  │          0-3           │\n"
            "  │                        │\n"
            "2 └────────────────────────┘");
  EXPECT_EQ(draw({8}, mesh_, {Shard{0}, Replicate{}}),
            "DTensor [8] f32, S(0),R on DeviceMesh((dp=2, tp=2), stride=(2, 1))\n"
            "0            4            8\n"
            "┌────────────┬────────────┐\n"
            "│    0,1     │    2,3     │\n"
            "└────────────┴────────────┘");
}

TEST_F(Visualize, PartialBlocksAreMarked) {
  EXPECT_EQ(draw({5, 4}, mesh_, {Shard{0}, Partial{}}),
            "DTensor [5, 4] f32, S(0),P(sum) on DeviceMesh((dp=2, tp=2), stride=(2, 1))\n"
            "  0                        4\n"
            "0 ┌────────────────────────┐\n"
            "  │                        │\n"
            "  │        0,1 (P)         │\n"
            "  │                        │\n"
            "3 ├────────────────────────┤\n"
            "  │        2,3 (P)         │\n"
            "  │                        │\n"
            "5 └────────────────────────┘\n"
            "(P): partial values; along mesh dim 1 ('tp') each block is the sum of its ranks' "
            "pieces");
}

TEST_F(Visualize, OtherRanksGetOneLinePerRank) {
  EXPECT_EQ(draw({2, 4, 2}, mesh_, {Shard{0}, Shard{1}}),
            "DTensor [2, 4, 2] f32, S(0),S(1) on DeviceMesh((dp=2, tp=2), stride=(2, 1))\n"
            "  rank   0 [0, 0]: [0:1, 0:2, 0:2]\n"
            "  rank   1 [0, 1]: [0:1, 2:4, 0:2]\n"
            "  rank   2 [1, 0]: [1:2, 0:2, 0:2]\n"
            "  rank   3 [1, 1]: [1:2, 2:4, 0:2]");
}

TEST_F(Visualize, ColoursBlocksWhenAsked) {
  DTensor x = distribute_tensor(zeros({4, 4}), mesh_, {Shard{0}, Shard{1}});
  const std::string text = visualize_sharding(x, {.color = VisualizeOptions::Color::Always});
  EXPECT_NE(text.find("│\x1b[30;103m     0      \x1b[0m│\x1b[30;106m     1      \x1b[0m│"),
            std::string::npos)
      << text;
  EXPECT_EQ(visualize_sharding(x).find('\x1b'), std::string::npos);  // not a terminal here
}

TEST_F(Visualize, LargeTensorsStayWithinTheLimits) {
  const std::string text = draw({100, 400}, mesh_, {Shard{0}, Shard{1}});
  size_t lines = 1;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 1 + 1 + 3 + 12u);  // header, axis, three borders, 12 interior rows
  EXPECT_NE(
      text.find("\n    0                                200                              400\n"),
      std::string::npos)
      << text;
}

}  // namespace
}  // namespace spmd
