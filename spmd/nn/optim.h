// spmd/nn/optim.h: optimizers and gradient clipping over the parameters of a model, Tensors or
// DTensors.
//
//   std::vector<DTensor*> params = {&model.wte, &model.w1, ...};
//   AdamW opt(params, {.lr = 3e-4, .weight_decay = 0.1});
//   backward(loss);
//   clip_grad_norm(params, 1.0);
//   opt.step();            // each parameter replaced by its update, a new leaf without gradient
//
// The math is PyTorch's (torch.optim.SGD with momentum and dampening 0, torch.optim.AdamW with
// decoupled weight decay and bias correction), written with DTensor ops outside the tape: a DTensor
// parameter's state (momentum, the moments) has the parameter's placements, and an update keeps
// them (elementwise ops follow their first input, Note [Following the first input]), so a step
// needs no communication: the gradients arrive already reduced (dp all_reduce, FSDP
// reduce_scatter). A parameter without a gradient is left as it is.
//
// Both constructors check their arguments as torch.optim does, and refuse NaN and infinities too
// (Note [Optimizer hyperparameters] in ops/optim.cpp): an empty parameter list, lr < 0, eps < 0, a
// beta outside [0, 1), weight_decay < 0 or momentum < 0 is a ConfigError naming the optimizer, the
// hyperparameter and the value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/nn/checkpoint.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;  // added to the gradient (L2), as torch.optim.SGD
};

// p -= lr * b, with b = momentum * b + (g + weight_decay * p) (b = that gradient at the first
// step).
template <class P>
class SGD {
 public:
  SGD(std::vector<P*> params, SGDOptions options = {},
      SourceLocation loc = SourceLocation::current());
  void step(SourceLocation loc = SourceLocation::current());
  // Drops every parameter's gradient.
  void zero_grad();
  // The momentum buffer of parameter i (undefined before its first step or without momentum).
  const P& momentum_buffer(size_t i) const { return momentum_.at(i); }

 private:
  std::vector<P*> params_;
  SGDOptions options_;
  std::vector<P> momentum_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p *= 1 - lr * weight_decay
};

// torch.optim.AdamW: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
// p = p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
template <class P>
class AdamW {
 public:
  AdamW(std::vector<P*> params, AdamWOptions options = {},
        SourceLocation loc = SourceLocation::current());
  void step(SourceLocation loc = SourceLocation::current());
  void zero_grad();
  // The moments of parameter i (undefined before its first step), placed like the parameter.
  const P& exp_avg(size_t i) const { return m_.at(i); }
  const P& exp_avg_sq(size_t i) const { return v_.at(i); }
  int64_t steps() const;
  // The state a checkpoint keeps (nn/checkpoint.h): "<prefix>m.<i>" and "<prefix>v.<i>" per
  // parameter (zeros placed like it where its first step has not run) and "<prefix>step", the
  // step count (an I64 tensor of one element). The entries point into this optimizer:
  // checkpoint::load fills them and the next step() goes on from the loaded count.
  checkpoint::StateDict state_dict(const std::string& prefix = "optim.");

 private:
  std::vector<P*> params_;
  AdamWOptions options_;
  std::vector<P> m_;
  std::vector<P> v_;
  int64_t steps_ = 0;
  Tensor step_count_;  // steps_ as state_dict hands it out (defined once it was asked for)
};

template <class P>
SGD(std::vector<P*>, SGDOptions) -> SGD<P>;
template <class P>
SGD(std::vector<P*>) -> SGD<P>;
template <class P>
AdamW(std::vector<P*>, AdamWOptions) -> AdamW<P>;
template <class P>
AdamW(std::vector<P*>) -> AdamW<P>;
// A braced list of parameters: `AdamW opt({&a, &b}, {.lr = 1e-3})`.
template <class P>
SGD(std::initializer_list<P*>, SGDOptions) -> SGD<P>;
template <class P>
SGD(std::initializer_list<P*>) -> SGD<P>;
template <class P>
AdamW(std::initializer_list<P*>, AdamWOptions) -> AdamW<P>;
template <class P>
AdamW(std::initializer_list<P*>) -> AdamW<P>;

// Scales every gradient by max_norm / (total + 1e-6) when the 2-norm of all gradients together,
// `total`, exceeds max_norm (torch.nn.utils.clip_grad_norm_), and returns `total`. max_norm must
// be >= 0 (+inf: no clipping); a negative one (which would flip every gradient's sign) or NaN is a
// ConfigError naming the value. A non-finite total (an overflow under loss scaling) is returned
// with the gradients left as they are, for GradScaler to skip the step (nn/grad_scaler.h). DTensor
// gradients: each one's squared norm is a partial sum over its mesh, all of one mesh reduced
// together (an all_reduce per mesh dim), then the meshes' totals added. Parameters may live on
// several meshes (mesh["tp"] beside mesh[{"dp", "tp"}]): each rank adds the totals of the meshes
// it is in, each counted once. Sibling meshes are replicas (a parameter on mesh["tp"] of a
// (dp, tp) mesh is the same on every dp coordinate); siblings whose totals differ (pipeline stages
// holding different parameters) are a DivergenceError: reduce those totals over the stage dim.
// Shape-only gradients (--spmd-tensors=meta) have no norm: NaN, gradients left as they are.
double clip_grad_norm(const std::vector<Tensor*>& params, double max_norm,
                      SourceLocation loc = SourceLocation::current());
double clip_grad_norm(const std::vector<DTensor*>& params, double max_norm,
                      SourceLocation loc = SourceLocation::current());
// `clip_grad_norm({&w, &b}, 1.0)`: a braced list of two pointers would otherwise also read as
// an iterator range for either vector overload (ambiguous).
inline double clip_grad_norm(std::initializer_list<Tensor*> params, double max_norm,
                             SourceLocation loc = SourceLocation::current()) {
  return clip_grad_norm(std::vector<Tensor*>(params), max_norm, loc);
}
inline double clip_grad_norm(std::initializer_list<DTensor*> params, double max_norm,
                             SourceLocation loc = SourceLocation::current()) {
  return clip_grad_norm(std::vector<DTensor*>(params), max_norm, loc);
}

// Zeros of t's shape and dtype (a DTensor: with t's placements, each rank allocating its piece).
Tensor zeros_like(const Tensor& t);
DTensor zeros_like(const DTensor& t);

extern template class SGD<Tensor>;
extern template class SGD<DTensor>;
extern template class AdamW<Tensor>;
extern template class AdamW<DTensor>;

}  // namespace spmd
