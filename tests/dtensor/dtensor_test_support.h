// tests/dtensor/dtensor_test_support.h: data, meshes and placements for the DTensor tests.
//
// Expected values come from global tensors every process can build from a seed; DTensors with
// Partial placements are built from a known decomposition of the global value (every rank
// computes only its own piece), so the same test bodies hold under mpirun, where a process
// holds one rank.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <spmd/dtensor/dtensor.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/random.h>
#include <spmd/testing.h>

namespace spmd::testing {

// Small integers as F32 (sums and products of a few stay exact): floor(rand * 16) - 8.
inline Tensor int_valued(const Shape& shape, uint64_t seed, DType dtype = DType::F32) {
  Tensor u = rand(shape, seed, DType::F64);
  std::vector<double> v = u.to_vector<double>();
  for (double& x : v) x = std::floor(x * 16.0) - 8.0;
  return from_vector(v, shape).reshape(shape).to(dtype);  // from_vector is 1-d for shape []
}

// The mesh of `shape` over the first ranks of the world, when the world has enough ranks and
// this process holds one of them.
inline std::optional<DeviceMesh> try_mesh(const World& world, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n > world.size()) return std::nullopt;
  DeviceMesh mesh = init_device_mesh(world, shape);
  for (int r : world.held_ranks()) {
    if (mesh.contains(r)) return mesh;
  }
  return std::nullopt;
}

// Every placement of a tensor with `ndim` dims: S(0..ndim-1), R, and the five Partials.
inline Placements all_placement_kinds(int ndim) {
  Placements out;
  for (int d = 0; d < ndim; ++d) out.push_back(Shard{d});
  out.push_back(Replicate{});
  for (ReduceOp op :
       {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
    out.push_back(Partial{op});
  }
  return out;
}

inline uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ULL + b + 0x632be59bd9b4e019ULL;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  return x ^ (x >> 29);
}

// Piece `c` of `value` split over k ranks so that reducing the pieces with `op` gives `value`
// exactly (for small-integer data): sum and avg add integer noise that cancels, max/min move all
// but one designated piece down/up, product multiplies by powers of two that cancel.
inline Tensor decompose(const Tensor& value, ReduceOp op, int64_t k, int64_t c, uint64_t seed) {
  if (k == 1) return value;
  auto noise = [&](int64_t j) {
    return int_valued(value.shape(), mix(seed, static_cast<uint64_t>(j)));
  };
  const int64_t chosen = static_cast<int64_t>(mix(seed, 977) % static_cast<uint64_t>(k));
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: {
      // Sum: noise_0 .. noise_{k-2}, value - their sum. Avg: the same plus value on each piece
      // but the last, so that the pieces add up to k * value.
      if (c < k - 1) {
        Tensor piece = noise(c).to(value.dtype());
        return op == ReduceOp::Avg ? value + piece : piece;
      }
      Tensor rest = value;
      for (int64_t j = 0; j < k - 1; ++j) rest = rest - noise(j).to(value.dtype());
      return rest;
    }
    case ReduceOp::Max:
      if (c == chosen) return value;
      return value - abs(noise(c)).to(value.dtype());
    case ReduceOp::Min:
      if (c == chosen) return value;
      return value + abs(noise(c)).to(value.dtype());
    case ReduceOp::Product: {
      auto power = [&](int64_t j) {
        return static_cast<double>(mix(seed, 5000 + static_cast<uint64_t>(j)) % 3) - 1.0;
      };
      if (c != chosen) return full(value.shape(), std::pow(2.0, power(c)), value.dtype());
      double total = 0;
      for (int64_t j = 0; j < k; ++j) {
        if (j != chosen) total += power(j);
      }
      return value * std::pow(2.0, -total);
    }
    default:
      ADD_FAILURE() << "decompose: not a Partial op";
      return value;
  }
}

// A DTensor of `spec` whose global value is `global`, each held rank building its own piece
// mesh dim by mesh dim (outer first): Shard narrows, Replicate keeps, Partial decomposes.
inline DTensor make_dtensor(const Tensor& global, const DeviceMesh& mesh,
                            const Placements& placements, uint64_t seed) {
  auto spec = std::make_shared<const DTensorSpec>(mesh, placements, global.shape(), global.dtype());
  const DTensorSpec::RankInfo& info = spec->rank_info();
  std::vector<Tensor> shards;
  for (size_t r = 0; r < info.ranks.size(); ++r) {
    const std::vector<int64_t>& coord = info.coordinates[r];
    Tensor value = global;
    uint64_t group_seed = seed;
    for (int i = 0; i < spec->mesh_ndim(); ++i) {
      const int64_t k = spec->mesh_shape()[static_cast<size_t>(i)];
      const Placement& p = spec->placements()[static_cast<size_t>(i)];
      if (const Shard* s = std::get_if<Shard>(&p)) {
        const int64_t n = value.size(s->dim);
        value = value.narrow(s->dim, shard_offset(n, k, coord[static_cast<size_t>(i)]),
                             shard_size(n, k, coord[static_cast<size_t>(i)]));
      } else if (const Partial* q = std::get_if<Partial>(&p)) {
        value = decompose(value, q->op, k, coord[static_cast<size_t>(i)], group_seed);
      }
      group_seed = mix(group_seed, static_cast<uint64_t>(coord[static_cast<size_t>(i)]) + 1);
    }
    shards.push_back(value.contiguous());
  }
  return DTensor(LocalTensor(info.ranks, std::move(shards)), spec);
}

// Whether the pieces of `d` are exactly (within tolerance) the blocks of `global` its spec gives
// each held rank; Partial mesh dims are skipped by comparing full tensors instead.
inline ::testing::AssertionResult pieces_match(const DTensor& d, const Tensor& global,
                                               double tol = 0.0) {
  const DTensorSpec& spec = d.spec();
  if (spec.has_partial()) {
    Tensor full = d.full_tensor();
    if (full.shape() != global.shape() ||
        (tol == 0.0 ? !equal(full, global) : !allclose(full, global, tol, tol))) {
      return ::testing::AssertionFailure() << "full_tensor of " << to_string(spec.placements())
                                           << " differs: got " << full << " expected " << global;
    }
    return ::testing::AssertionSuccess();
  }
  const DTensorSpec::RankInfo& info = spec.rank_info();
  for (size_t r = 0; r < info.ranks.size(); ++r) {
    Tensor expected = global;
    for (size_t dim = 0; dim < info.local_offsets[r].size(); ++dim) {
      expected = expected.narrow(static_cast<int64_t>(dim), info.local_offsets[r][dim],
                                 info.local_shapes[r][dim]);
    }
    const Tensor& got = d.local().shard(info.ranks[r]);
    const bool ok = got.shape() == expected.shape() &&
                    (tol == 0.0 ? equal(got, expected) : allclose(got, expected, tol, tol));
    if (!ok) {
      return ::testing::AssertionFailure()
             << "rank " << info.ranks[r] << " of " << to_string(spec.placements()) << " on "
             << spec.mesh() << ": got " << got << " expected " << expected;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace spmd::testing
