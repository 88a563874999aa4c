// spmd/collectives/blocks.cpp: the block layouts of collectives/blocks.h.
#include <spmd/collectives/blocks.h>

#include <vector>

#include <spmd/ops/ops.h>

namespace spmd {

Shape stacked_shape(int64_t n, const Shape& shape) {
  Shape out;
  out.reserve(shape.size() + 1);
  out.push_back(n);
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

Tensor pieces_stacked(const Tensor& t, int64_t d, int64_t n) {
  if (d == 0) return t;
  const int64_t piece = t.size(d) / n;
  std::vector<Tensor> pieces;
  pieces.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) pieces.push_back(t.narrow(d, k * piece, piece));
  return stack(pieces, 0).contiguous();
}

Tensor concat_blocks(const Tensor& buffer, int64_t d) {
  const int64_t n = buffer.size(0);
  if (d == 0) {
    Shape shape(buffer.shape().begin() + 1, buffer.shape().end());
    shape[0] *= n;
    return buffer.reshape(shape);
  }
  std::vector<Tensor> pieces;
  pieces.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) pieces.push_back(buffer.select(0, k));
  return cat(pieces, d);
}

}  // namespace spmd
