// spmd/nn/grad_scaler.h: dynamic loss scaling for low-precision training (torch.amp.GradScaler).
//
//   GradScaler<DTensor> scaler;                      // scale 65536, x2 every 2000 good steps
//   backward(scaler.scale(loss));                    // scaled gradients: small ones survive f16
//   scaler.unscale(params);                          // optional: true gradients before clipping
//   clip_grad_norm(params, 1.0);                     // an overflow leaves them as they are
//   scaler.step(opt, params);                        // skipped when a gradient is inf or NaN
//   scaler.update();                                 // halve after a skip, double after 2000 good
//
// Overflow is detected over every rank (each gradient's non-finite count is reduced over its
// mesh), so every rank skips the same steps. From scale() to update() --spmd-debug=nan reports
// nothing: the overflows are the scaler's to handle (Note [Expected overflow] in
// world/nonfinite.h); a NaN in the forward, before scale(), is still reported. With `enabled`
// false every call passes through (scale 1, never skips).
#pragma once

#include <cstdint>
#include <vector>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/tensor/tensor.h>

namespace spmd {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16, as PyTorch
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

template <class P>
class GradScaler {
 public:
  // ConfigError naming the option for init_scale <= 0, growth_factor <= 1, backoff_factor outside
  // (0, 1) or growth_interval < 1.
  explicit GradScaler(GradScalerOptions options = {},
                      SourceLocation loc = SourceLocation::current());
  ~GradScaler();
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;

  // loss * scale, recorded: its backward gives the scaled gradients. Opens the window of Note
  // [Expected overflow] until update().
  P scale(const P& loss, SourceLocation loc = SourceLocation::current());
  // Divides every parameter's gradient by the scale (once per step: a second call does nothing)
  // and returns whether any holds inf or NaN, the same answer on every rank.
  bool unscale(const std::vector<P*>& params, SourceLocation loc = SourceLocation::current());
  // opt.step() unless a gradient holds inf or NaN (unscale() first when not yet called); returns
  // whether it stepped.
  template <class Optimizer>
  bool step(Optimizer& opt, const std::vector<P*>& params,
            SourceLocation loc = SourceLocation::current()) {
    if (!options_.enabled) {
      opt.step(loc);
      return true;
    }
    const bool overflow = unscale(params, loc);
    if (!overflow) opt.step(loc);
    return !overflow;
  }
  // The next step's scale: times backoff_factor after a skipped step, times growth_factor after
  // growth_interval steps in a row without one. Closes the window.
  void update();

  double scale_value() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t good_ = 0;     // steps without overflow since the last change of scale
  int64_t skipped_ = 0;  // steps skipped so far
  bool unscaled_ = false;
  bool overflow_ = false;
  bool window_ = false;  // holding Note [Expected overflow]
};

}  // namespace spmd
