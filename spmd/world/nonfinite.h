// spmd/world/nonfinite.h: the window in which non-finite values are expected, not bugs.
//
// Note [Expected overflow]
// Dynamic loss scaling (GradScaler, nn/grad_scaler.h) multiplies the loss by a large factor so
// that small gradients survive in low precision, and expects the scaled gradients to overflow now
// and then: it detects inf/NaN in them, skips the step and lowers the scale. From its scale(loss)
// to its update() a scaler holds this window open, and --spmd-debug=nan (debug/checks.h) reports
// nothing inside it: the overflows are the scaler's to handle. A NaN made before scale() (the
// forward, the loss) is still reported. Process-wide, counted: several scalers may hold it.
#pragma once

namespace spmd {

// Opens and closes one hold of the window.
void open_expected_overflow();
void close_expected_overflow();
// Whether some hold is open.
bool expected_overflow();

}  // namespace spmd
