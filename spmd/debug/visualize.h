// spmd/debug/visualize.h: visualize_sharding, which ranks hold which block of a DTensor, drawn as a
// grid in the terminal.
//
// A 2-D tensor is drawn as rows (dim 0) by columns (dim 1), a 1-D tensor as one row of columns.
// Each block is labelled with every rank that holds it (replicas and sibling meshes included, runs
// collapsed: "0-3,8"), block boundaries are numbered along the axes, and sizes are drawn to scale
// (one text row per tensor row up to max_height, column widths proportional to the block sizes
// while every label still fits). Ranks holding an empty block are listed under the grid. With a
// Partial mesh dim each block holds partial values: the labels end in "(P)" and a line under the
// grid says along which mesh dim and with which op they reduce. Other ranks (0-D or over 2 dims)
// get one line per rank with its block. Computed from the spec alone: every process draws every
// rank's block, under any backend.
//
//   DTensor x = distribute_tensor(zeros({5, 6}), mesh, {Shard{0}, Shard{1}});  // mesh (2, 2)
//   fmt::print("{}\n", visualize_sharding(x, {.color = VisualizeOptions::Color::Never}));
//
//   DTensor [5, 6] f32, S(0),S(1) on DeviceMesh((dp=2, tp=2), stride=(2, 1))
//     0            3            6
//   0 ┌────────────┬────────────┐
//     │            │            │
//     │     0      │     1      │
//     │            │            │
//   3 ├────────────┼────────────┤
//     │     2      │     3      │
//     │            │            │
//   5 └────────────┴────────────┘
#pragma once

#include <string>
#include <vector>

#include <spmd/dtensor/dtensor.h>

namespace spmd {

struct VisualizeOptions {
  // Auto: colour each block when stdout is a terminal (isatty), TERM is set and not "dumb", and
  // NO_COLOR is unset or empty (no-color.org).
  enum class Color { Auto, Always, Never };
  Color color = Color::Auto;
  int max_width = 64;   // columns of block interiors, beyond what labels need
  int max_height = 12;  // text rows of block interiors (2-D)
};

// Which ranks hold which block, drawn as a grid for 1-D and 2-D tensors (every rank, computed from
// the spec, not only the held ones).
std::string visualize_sharding(const DTensor& tensor, const VisualizeOptions& options);
// The same with the default options.
std::string visualize_sharding(const DTensor& tensor);

}  // namespace spmd
