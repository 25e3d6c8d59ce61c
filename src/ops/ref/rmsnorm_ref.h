// RMSNorm over the last axis (formats.md 1.4): double-precision reference.
//
//   rstd[r] = 1 / sqrt(mean_c(x[r, c]^2) + eps);   y[r, c] = w[c] * (x[r, c] * rstd[r])
//
// Used for the hidden norms (rows = tokens, cols = hidden) and Qwen3's per-head q/k norms
// (rows = tokens * heads, cols = head_dim, one [head_dim] weight shared by all heads).
// In double there is no rounding point between the normalisation and the weight multiply;
// HF casts to the activation dtype first (formats.md 1.4), which only matters below fp32.
#pragma once
#include <cstdint>

namespace forja::ref {

// y[rows, cols], rstd[rows] (saved for backward; may be nullptr), x[rows, cols], w[cols].
// y may alias x.
void rmsnorm_forward(double* y, double* rstd, const double* x, const double* w, int64_t rows,
                     int64_t cols, double eps);

// dx[rows, cols] = d(sum dy * y)/dx (activation gradient: written with =);
// dy[rows, cols], x[rows, cols], w[cols], rstd[rows] from the forward. dx may alias dy.
//   dx = rstd * w * dy - x * rstd^3 / cols * sum_c(dy * w * x)
void rmsnorm_backward(double* dx, const double* dy, const double* x, const double* w,
                      const double* rstd, int64_t rows, int64_t cols);

// dw[cols] += sum_r dy[r, c] * x[r, c] * rstd[r]  (parameter gradient: accumulates). forja's norm
// weights are frozen; this exists for completeness.
void rmsnorm_backward_dw(double* dw, const double* dy, const double* x, const double* rstd,
                         int64_t rows, int64_t cols);

}  // namespace forja::ref
