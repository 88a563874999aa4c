// spmd/ops/rope.cpp: rotary position embeddings (RoPE), the entry rotary_embedding.
//
// Note [Rotary embeddings]
// x [..., S, H, D] (Llama's layout: batch, sequence, heads, head dim; D even) is rotated pair by
// pair: pair i of the row at position p turns by the angle p * f_i, with f_i = theta^(-2i / D)
// computed in double, optionally rescaled as Llama 3.1 does (Meta's apply_scaling, which HF calls
// rope_type "llama3"): with wavelength w_i = 2 pi / f_i, w_i < original / high_freq_factor keeps
// f_i, w_i > original / low_freq_factor gives f_i / factor, and in between
// (1 - s) f_i / factor + s f_i with s = (original / w_i - low_freq_factor) / (high_freq_factor -
// low_freq_factor). The pairs are (2i, 2i + 1) (interleaved: Meta's reference code, which views
// x as D/2 complex numbers and multiplies by e^{i p f_i}) or (i, i + D/2) (HF's rotate_half):
//   y_a = x_a cos(p f_i) - x_b sin(p f_i),   y_b = x_a sin(p f_i) + x_b cos(p f_i).
// The positions are an integer input [S] (or x's dims before H: [B, S]) sharded like x's rows,
// or, with x alone, each row's global index along S: a piece takes its rows' global offset from
// PieceContext, so a sequence-sharded DTensor (context parallelism) rotates by global positions.
// args.ints = [sign, interleaved, scaled], args.reals = [theta, factor, low_freq_factor,
// high_freq_factor, original_max_position]; sign -1 turns by the opposite angle, which is the
// backward (the rotation is orthogonal: its transpose is its inverse).
#include <cmath>
#include <numbers>

#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/ops/strategy.h>
#include <spmd/tensor/factory.h>

namespace spmd {
namespace {

constexpr std::string_view kRope = "rotary_embedding";

// The config rope_args packed into args.
struct RopeArgs {
  int64_t sign;
  bool interleaved;
  RopeConfig config;
};

RopeArgs unpack(const OpArgs& args) {
  RopeArgs r{args.ints.at(0), args.ints.at(1) != 0, {}};
  r.config.theta = args.reals.at(0);
  r.config.interleaved = r.interleaved;
  if (args.ints.at(2) != 0) {
    r.config.scaling =
        RopeScaling{args.reals.at(1), args.reals.at(2), args.reals.at(3), args.reals.at(4)};
  }
  return r;
}

void check_config(const RopeArgs& r, const Shape& x) {
  const RopeConfig& c = r.config;
  if (r.sign != 1 && r.sign != -1) {
    throw_error<ConfigError>("{}: the sign must be 1 or -1, got {} (x {})", kRope, r.sign,
                             shape_str(x));
  }
  if (!(c.theta > 0.0) || !std::isfinite(c.theta)) {
    throw_error<ConfigError>("{}: theta must be finite and > 0, got {} (x {})", kRope, c.theta,
                             shape_str(x));
  }
  if (c.scaling) {
    const RopeScaling& s = *c.scaling;
    const bool ok = s.factor > 0.0 && std::isfinite(s.factor) && s.low_freq_factor > 0.0 &&
                    s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor) &&
                    s.original_max_position > 0.0 && std::isfinite(s.original_max_position);
    if (!ok) {
      throw_error<ConfigError>(
          "{}: the Llama 3.1 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
          "original_max_position > 0, got factor {}, low_freq_factor {}, high_freq_factor {}, "
          "original_max_position {} (x {})",
          kRope, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position,
          shape_str(x));
    }
  }
}

OpMeta rope_meta(std::span<const InputMeta> in, const OpArgs& args) {
  const Shape& x = *in[0].shape;
  if (!is_floating(in[0].dtype)) {
    throw_error<Unsupported>("{}: x must be floating, got {} (shape {})", kRope, in[0].dtype,
                             shape_str(x));
  }
  if (x.size() < 3 || x.back() % 2 != 0) {
    throw_error<ShapeError>("{}: expects x [..., S, H, D] with an even head dim D, got x {}", kRope,
                            shape_str(x));
  }
  check_config(unpack(args), x);
  if (in.size() == 2) {
    const Shape& p = *in[1].shape;
    if (in[1].dtype != DType::I64 && in[1].dtype != DType::I32) {
      throw_error<Unsupported>("{}: the positions must be I64 or I32, got {} (shape {})", kRope,
                               in[1].dtype, shape_str(p));
    }
    const Shape rows(x.begin(), x.end() - 2);
    if (p != Shape{x[x.size() - 3]} && p != rows) {
      throw_error<ShapeError>(
          "{}: the positions must have shape [S] = [{}] or x's dims before the heads {}, got "
          "positions {} for x {}",
          kRope, x[x.size() - 3], shape_str(rows), shape_str(p), shape_str(x));
    }
  }
  return OpMeta{x, in[0].dtype};
}

}  // namespace

std::vector<double> rope_frequencies(int64_t head_dim, const RopeConfig& config) {
  std::vector<double> f(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = 1.0 / std::pow(config.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (!config.scaling) continue;
    const RopeScaling& s = *config.scaling;
    const double wavelen = 2.0 * std::numbers::pi / f[i];
    const double low_freq_wavelen = s.original_max_position / s.low_freq_factor;
    const double high_freq_wavelen = s.original_max_position / s.high_freq_factor;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      f[i] /= s.factor;
    } else {
      const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      f[i] = (1.0 - smooth) * f[i] / s.factor + smooth * f[i];
    }
  }
  return f;
}

namespace {

// x rotated by the angles of `positions` (integer, host-readable; shape [S] or x's dims before H).
Tensor rotate(const Tensor& x, const Tensor& positions, const OpArgs& args) {
  const RopeArgs r = unpack(args);
  const int64_t n = x.dim();
  const int64_t half = x.size(-1) / 2;
  const DType dtype = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  if (x.is_meta() || positions.is_meta()) return empty(x.shape(), x.dtype(), x.device());
  // The angles in double, [positions..., 1, D/2]: they broadcast over the heads (and, for
  // positions [S], over the batch dims).
  const std::vector<double> f = rope_frequencies(x.size(-1), r.config);
  const Tensor host = positions.to(cpu()).to(DType::I64).contiguous();
  const int64_t* p = host.data<int64_t>();
  std::vector<double> c(static_cast<size_t>(host.numel() * half));
  std::vector<double> s(c.size());
  for (int64_t i = 0; i < host.numel(); ++i) {
    for (int64_t j = 0; j < half; ++j) {
      const double angle = static_cast<double>(p[i]) * f[static_cast<size_t>(j)];
      c[static_cast<size_t>(i * half + j)] = std::cos(angle);
      s[static_cast<size_t>(i * half + j)] = static_cast<double>(r.sign) * std::sin(angle);
    }
  }
  Shape angles = host.shape();
  angles.push_back(1);
  angles.push_back(half);
  const Tensor cos = from_vector(c, angles).to(dtype).to(x.device());
  const Tensor sin = from_vector(s, angles).to(dtype).to(x.device());
  const Tensor xc = x.to(dtype);
  Tensor a, b;
  if (r.interleaved) {
    Shape pairs = x.shape();
    pairs.back() = half;
    pairs.push_back(2);
    const Tensor xp = xc.reshape(pairs);
    a = xp.select(n, 0);
    b = xp.select(n, 1);
  } else {
    a = xc.narrow(n - 1, 0, half);
    b = xc.narrow(n - 1, half, half);
  }
  const Tensor ya = a * cos - b * sin;
  const Tensor yb = a * sin + b * cos;
  const Tensor y = r.interleaved ? stack({ya, yb}, n).reshape(x.shape()) : cat({ya, yb}, n - 1);
  return y.to(x.dtype());
}

// Positions offset, offset + 1, ... for the rows of x.
Tensor row_positions(const Tensor& x, int64_t offset) {
  std::vector<int64_t> p(static_cast<size_t>(x.size(-3)));
  for (size_t i = 0; i < p.size(); ++i) p[i] = offset + static_cast<int64_t>(i);
  return from_vector(p, {x.size(-3)});
}

Tensor rope_compute(std::span<const Tensor> in, const OpArgs& args, const OpMeta&) {
  return rotate(in[0], in.size() == 2 ? in[1] : row_positions(in[0], 0), args);
}

// With x alone, the rows' global positions start at the piece's offset along S.
Tensor rope_piece(std::span<const Tensor> pieces, const OpArgs& args, const PieceContext& where) {
  if (pieces.size() == 2) return rotate(pieces[0], pieces[1], args);
  const Shape offset = where.inputs[0]->local_offset(where.coordinate);
  return rotate(pieces[0], row_positions(pieces[0], offset[offset.size() - 3]), args);
}

// Every dim of x but D shards (the positions along with x's dims they have); a pending sum or
// average of x passes (the op is linear in x) with the positions Replicate.
std::vector<OpStrategy> rope_strategies(ShardingInputs in, const OpArgs&, const OpMeta&) {
  const size_t n = in.size();
  const int nd = static_cast<int>(in[0]->ndim());
  const int first = n == 2 ? nd - 2 - static_cast<int>(in[1]->ndim()) : 0;
  std::vector<DimOption> options = {{std::vector<Placement>(n, Replicate{}), Replicate{}}};
  for (int d = 0; d + 1 < nd; ++d) {
    DimOption o{std::vector<Placement>(n, Replicate{}), Shard{d}};
    o.inputs[0] = Shard{d};
    if (n == 2 && d >= first && d < nd - 2) o.inputs[1] = Shard{d - first};
    options.push_back(std::move(o));
  }
  for (ReduceOp o : {ReduceOp::Sum, ReduceOp::Avg}) {
    DimOption p{std::vector<Placement>(n, Replicate{}), Partial{o}};
    p.inputs[0] = Partial{o};
    options.push_back(std::move(p));
  }
  return expand_dim_options(in, options);
}

// The transpose of a rotation is the rotation by the opposite angle.
void rope_backward(BackwardContext& c) {
  if (!c.needs_grad(0)) return;
  OpArgs inverse = c.args();
  inverse.ints.at(0) = -inverse.ints.at(0);
  if (c.num_inputs() == 2) {
    c.set_grad(0, apply(op::rotary_embedding, {c.grad(), c.input(1)}, inverse));
  } else {
    c.set_grad(0, apply(op::rotary_embedding, {c.grad()}, inverse));
  }
}

// Two products and a sum per element.
double rope_flops(std::span<const InputMeta> in, const OpMeta&) {
  double n = 1.0;
  for (int64_t s : *in[0].shape) n *= static_cast<double>(s);
  return 3.0 * n;
}

// Meta's reference code and torchtitan rotate in complex numbers, with no fused kernel (Note
// [Eager kernels] in debug/dry_run.h): x cast to F32, viewed as complex pairs, multiplied by the
// [S, D/2] complex64 table (read once per kernel: S * D * 4 bytes), viewed back and cast to x's
// dtype; autograd's backward runs the same three kernels with the table's conjugate, which it
// copies first. Per element, with e the bytes of x's dtype and a of its math dtype (F32, F64 for
// F64), c = e + a where x is cast (else 0): c + 2a + c, plus the table's bytes.
// bench/peers/eager_kernels.py counts 20.25 and 20.75 bytes per element in BF16 at S 64, 8 heads.
double rope_eager_bytes(std::span<const InputMeta> in, const OpArgs& args, const OpMeta&) {
  const Shape& shape = *in[0].shape;
  const double n = static_cast<double>(shape_numel(shape));
  const double e = static_cast<double>(itemsize(in[0].dtype));
  const DType math = in[0].dtype == DType::F64 ? DType::F64 : DType::F32;
  const double a = static_cast<double>(itemsize(math));
  const double c = in[0].dtype == math ? 0.0 : e + a;
  const double table = shape.size() >= 2
                           ? static_cast<double>(shape[1]) * static_cast<double>(shape.back()) * a
                           : 0.0;
  const bool backward = args.ints.at(0) < 0;
  return n * (c + 2 * a + c) + table * (backward ? 3.0 : 1.0);
}

const EagerKernels kRopeEager{
    .of = "rotary_embedding",
    .bytes = rope_eager_bytes,
    .source = "Meta's reference RoPE (torchtitan's): cast, complex multiply, cast back",
};

}  // namespace

OpArgs rope_args(const RopeConfig& config) {
  const RopeScaling s = config.scaling.value_or(RopeScaling{});
  return OpArgs{
      {1, config.interleaved ? 1 : 0, config.scaling ? 1 : 0},
      {config.theta, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position}};
}

const OpDef op::rotary_embedding{
    .name = "rotary_embedding",
    .meta = rope_meta,
    .compute = rope_compute,
    .strategies = rope_strategies,
    .piece = rope_piece,
    .backward = rope_backward,
    .partial_use = PartialUse::Unary,
    .flops = rope_flops,
    .eager = &kRopeEager,
};

}  // namespace spmd
