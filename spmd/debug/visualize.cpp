// spmd/debug/visualize.cpp: visualize_sharding (debug/visualize.h; the one-argument form is
// declared in dtensor/dtensor.h).
#include <spmd/debug/visualize.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include <spmd/core/env.h>
#include <spmd/core/format.h>

namespace spmd {
namespace {

// One distinct block of the tensor and the ranks holding it.
struct Block {
  Shape offset;
  Shape size;
  std::vector<int> ranks;  // ascending
};

std::vector<Block> blocks_of(const DTensorSpec& spec) {
  const DeviceMesh& mesh = spec.mesh();
  std::map<std::pair<Shape, Shape>, std::vector<int>> by_block;
  std::vector<std::pair<Shape, Shape>> order;
  for (int rank = 0; rank < mesh.world().size(); ++rank) {
    auto coordinate = mesh.coordinate_of(rank);
    if (!coordinate) continue;
    std::pair<Shape, Shape> key{spec.local_offset(*coordinate), spec.local_shape(*coordinate)};
    auto [it, inserted] = by_block.try_emplace(key);
    if (inserted) order.push_back(key);
    it->second.push_back(rank);
  }
  std::vector<Block> out;
  for (const auto& key : order) out.push_back(Block{key.first, key.second, by_block[key]});
  return out;
}

bool use_color(VisualizeOptions::Color mode) {
  if (mode != VisualizeOptions::Color::Auto) return mode == VisualizeOptions::Color::Always;
  if (env_value("NO_COLOR")) return false;
  const std::optional<std::string> term = env_value("TERM");
  return term && *term != "dumb" && isatty(fileno(stdout));
}

// Background colours (bright, with black text) cycled over the blocks.
constexpr int kBackgrounds[] = {103, 106, 102, 105, 104, 101, 107, 43, 46, 42, 45};

std::string repeat(const std::string& unit, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += unit;
  return out;
}

std::string centered(const std::string& text, size_t width) {
  const size_t pad = width - std::min(width, text.size());
  return std::string(pad / 2, ' ') + text + std::string(pad - pad / 2, ' ');
}

// Splits [0, n) at every block boundary: the segment starts, then n.
std::vector<int64_t> boundaries(const std::vector<Block>& blocks, size_t dim, int64_t n) {
  std::vector<int64_t> out = {0, n};
  for (const Block& b : blocks) {
    if (shape_numel(b.size) == 0) continue;
    out.push_back(b.offset[dim]);
    out.push_back(b.offset[dim] + b.size[dim]);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Sizes for segments of `lengths` (positive) summing to about `total`, each at least its minimum:
// proportional, rounded by largest remainder (ties to the first).
std::vector<size_t> allocate(const std::vector<int64_t>& lengths,
                             const std::vector<size_t>& minimum, size_t total) {
  int64_t n = 0;
  for (int64_t l : lengths) n += l;
  std::vector<size_t> out(lengths.size());
  std::vector<std::pair<double, size_t>> remainders;
  size_t used = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const double exact =
        static_cast<double>(total) * static_cast<double>(lengths[i]) / static_cast<double>(n);
    out[i] = static_cast<size_t>(exact);
    used += out[i];
    remainders.emplace_back(-(exact - static_cast<double>(out[i])), i);
  }
  std::stable_sort(remainders.begin(), remainders.end());
  for (size_t k = 0; used < total && k < remainders.size(); ++k, ++used) {
    ++out[remainders[k].second];
  }
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::max(out[i], minimum[i]);
  return out;
}

// Widths of the column segments: a whole number of columns per element when that fits in
// max_width (so equal blocks get equal widths), every label fitting with a space either side.
std::vector<size_t> column_widths(const std::vector<int64_t>& lengths,
                                  const std::vector<size_t>& label_widths, int max_width) {
  constexpr size_t kMinWidth = 24;
  int64_t n = 0;
  for (int64_t l : lengths) n += l;
  std::vector<size_t> minimum;
  size_t per_element = (kMinWidth + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
  for (size_t i = 0; i < lengths.size(); ++i) {
    minimum.push_back(label_widths[i] + 2);
    const size_t needed =
        (minimum[i] + static_cast<size_t>(lengths[i]) - 1) / static_cast<size_t>(lengths[i]);
    per_element = std::max(per_element, needed);
  }
  const size_t limit = static_cast<size_t>(std::max(max_width, 1));
  if (per_element * static_cast<size_t>(n) <= limit) {
    std::vector<size_t> out;
    for (int64_t l : lengths) out.push_back(per_element * static_cast<size_t>(l));
    return out;
  }
  return allocate(lengths, minimum, limit);
}

// Text rows of the row segments: one per tensor row when they fit in max_height.
std::vector<size_t> row_heights(const std::vector<int64_t>& lengths, int max_height) {
  int64_t n = 0;
  for (int64_t l : lengths) n += l;
  const size_t limit = static_cast<size_t>(std::max(max_height, 1));
  if (static_cast<size_t>(n) <= limit) {
    return std::vector<size_t>(lengths.begin(), lengths.end());
  }
  return allocate(lengths, std::vector<size_t>(lengths.size(), 1), limit);
}

std::string header(const DTensorSpec& spec) {
  return fmt::format("DTensor {} {}, {} on {}", shape_str(spec.shape()), spec.dtype(),
                     to_string(spec.placements()), spec.mesh().to_string());
}

std::string footer(const DTensorSpec& spec, const std::vector<Block>& blocks) {
  std::string out;
  for (int i = 0; i < spec.mesh_ndim(); ++i) {
    if (const Partial* p = std::get_if<Partial>(&spec.placements()[static_cast<size_t>(i)])) {
      out += fmt::format(
          "\n(P): partial values; along mesh dim {} ('{}') each block is the {} of its ranks' "
          "pieces",
          i, spec.mesh().dim_name(i), reduce_op_str(p->op));
    }
  }
  for (const Block& b : blocks) {
    if (shape_numel(b.size) != 0 || spec.numel() == 0) continue;
    std::string range;
    for (size_t d = 0; d < b.size.size(); ++d) {
      range += fmt::format("{}{}:{}", d ? ", " : "", b.offset[d], b.offset[d] + b.size[d]);
    }
    out += fmt::format("\nempty: rank{} {} hold{} no elements [{}]", b.ranks.size() > 1 ? "s" : "",
                       ranks_compact(b.ranks), b.ranks.size() > 1 ? "" : "s", range);
  }
  return out;
}

// 0-D and over-2-D tensors, and empty ones: one line per rank.
std::string rank_lines(const DTensorSpec& spec) {
  const DeviceMesh& mesh = spec.mesh();
  std::string out;
  for (int rank = 0; rank < mesh.world().size(); ++rank) {
    auto coordinate = mesh.coordinate_of(rank);
    if (!coordinate) continue;
    const Shape offset = spec.local_offset(*coordinate);
    const Shape size = spec.local_shape(*coordinate);
    std::string block;
    for (size_t d = 0; d < size.size(); ++d) {
      block += fmt::format("{}{}:{}", d ? ", " : "", offset[d], offset[d] + size[d]);
    }
    out += fmt::format("\n  rank {:>3} {}: [{}]{}", rank, shape_str(*coordinate), block,
                       shape_numel(size) == 0 ? " (empty)" : "");
  }
  return out;
}

// Numbers placed at column positions (skipping one that would touch the previous one).
std::string axis_line(const std::vector<size_t>& positions, const std::vector<int64_t>& values,
                      size_t indent) {
  std::string out(indent, ' ');
  size_t column = 0;  // display column after what `out` holds beyond the indent
  for (size_t k = 0; k < positions.size(); ++k) {
    const std::string text = fmt::format("{}", values[k]);
    if (k > 0 && positions[k] < column + 1) continue;
    out += std::string(positions[k] - column, ' ') + text;
    column = positions[k] + text.size();
  }
  return out;
}

}  // namespace

std::string visualize_sharding(const DTensor& tensor, const VisualizeOptions& options) {
  if (!tensor.defined())
    throw_error<PlacementError>("visualize_sharding: the DTensor is undefined");
  const DTensorSpec& spec = tensor.spec();
  const std::vector<Block> blocks = blocks_of(spec);
  const int64_t ndim = spec.ndim();
  if (ndim == 0 || ndim > 2 || spec.numel() == 0) {
    return header(spec) + rank_lines(spec) + footer(spec, blocks);
  }
  const bool color = use_color(options.color);
  const bool partial = spec.has_partial();
  const bool two_d = ndim == 2;
  const size_t col_dim = two_d ? 1 : 0;
  const std::vector<int64_t> cols = boundaries(blocks, col_dim, spec.shape()[col_dim]);
  const std::vector<int64_t> rows =
      two_d ? boundaries(blocks, 0, spec.shape()[0]) : std::vector<int64_t>{0, 1};

  // The block covering each (row segment, column segment) cell, and its label.
  const size_t num_rows = rows.size() - 1;
  const size_t num_cols = cols.size() - 1;
  std::vector<std::vector<size_t>> cell(num_rows, std::vector<size_t>(num_cols, 0));
  std::vector<std::string> labels;
  for (const Block& b : blocks) labels.push_back(ranks_compact(b.ranks) + (partial ? " (P)" : ""));
  std::vector<size_t> label_widths(num_cols, 0);
  for (size_t i = 0; i < num_rows; ++i) {
    for (size_t j = 0; j < num_cols; ++j) {
      for (size_t k = 0; k < blocks.size(); ++k) {
        const Block& b = blocks[k];
        if (shape_numel(b.size) == 0) continue;
        const bool row_inside =
            !two_d || (b.offset[0] <= rows[i] && rows[i] < b.offset[0] + b.size[0]);
        const bool col_inside =
            b.offset[col_dim] <= cols[j] && cols[j] < b.offset[col_dim] + b.size[col_dim];
        if (row_inside && col_inside) {
          cell[i][j] = k;
          break;
        }
      }
      label_widths[j] = std::max(label_widths[j], labels[cell[i][j]].size());
    }
  }
  std::vector<int64_t> col_lengths;
  for (size_t j = 0; j < num_cols; ++j) col_lengths.push_back(cols[j + 1] - cols[j]);
  std::vector<int64_t> row_lengths;
  for (size_t i = 0; i < num_rows; ++i) row_lengths.push_back(rows[i + 1] - rows[i]);
  const std::vector<size_t> widths = column_widths(col_lengths, label_widths, options.max_width);
  const std::vector<size_t> heights =
      two_d ? row_heights(row_lengths, options.max_height) : std::vector<size_t>{1};

  size_t gutter = 0;
  if (two_d) {
    for (int64_t r : rows) gutter = std::max(gutter, fmt::format("{}", r).size());
    gutter += 1;
  }
  auto gutter_text = [&](std::optional<int64_t> value) {
    if (!two_d) return std::string();
    const std::string text = value ? fmt::format("{}", *value) : "";
    return std::string(gutter - 1 - text.size(), ' ') + text + " ";
  };
  auto border = [&](const char* left, const char* middle, const char* right) {
    std::string line = left;
    for (size_t j = 0; j < num_cols; ++j) {
      line += repeat("─", widths[j]) + (j + 1 < num_cols ? middle : right);
    }
    return line;
  };

  std::string out = header(spec) + "\n";
  std::vector<size_t> positions;
  size_t position = 0;
  for (size_t j = 0; j <= num_cols; ++j) {
    positions.push_back(position);
    if (j < num_cols) position += widths[j] + 1;
  }
  out += axis_line(positions, cols, gutter) + "\n";
  out += gutter_text(0) + border("┌", "┬", "┐") + "\n";
  for (size_t i = 0; i < num_rows; ++i) {
    for (size_t line = 0; line < heights[i]; ++line) {
      out += gutter_text(std::nullopt) + "│";
      for (size_t j = 0; j < num_cols; ++j) {
        const size_t k = cell[i][j];
        const std::string text = centered(line == (heights[i] - 1) / 2 ? labels[k] : "", widths[j]);
        if (color) {
          out +=
              fmt::format("\x1b[30;{}m{}\x1b[0m",
                          kBackgrounds[k % (sizeof kBackgrounds / sizeof kBackgrounds[0])], text);
        } else {
          out += text;
        }
        out += "│";
      }
      out += "\n";
    }
    if (i + 1 < num_rows) out += gutter_text(rows[i + 1]) + border("├", "┼", "┤") + "\n";
  }
  out += gutter_text(two_d ? std::optional<int64_t>(rows.back()) : std::nullopt) +
         border("└", "┴", "┘");
  return out + footer(spec, blocks);
}

std::string visualize_sharding(const DTensor& tensor) {
  return visualize_sharding(tensor, VisualizeOptions{});
}

}  // namespace spmd
