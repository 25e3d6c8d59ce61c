// Optimizer references: AdamW step (formats.md 6.2), global-norm gradient clipping (6.3) and
// learning-rate schedules (6.4), in double precision.
#pragma once
#include <cstdint>

namespace forja::ref {

// One AdamW step on param/m/v/grad [n], at step t (1-based: the first step is t = 1):
//   param *= 1 - lr * weight_decay                 (decoupled decay, first)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps      (eps after bias correction)
//   param -= lr / (1 - beta1^t) * m / denom
// m and v start at 0 and are updated in place.
void adamw_step(double* param, double* m, double* v, const double* grad, int64_t n, int64_t t,
                double lr, double beta1, double beta2, double eps, double weight_decay);

// Global-norm clipping over num_bufs buffers grads[b] of sizes[b] elements (formats.md 6.3):
//   total = sqrt(sum of squares of every element);  coef = min(1, max_norm / (total + 1e-6));
//   every gradient *= coef. Returns the UNCLIPPED total. Like torch (error_if_nonfinite=False),
//   a non-finite total multiplies the gradients by NaN; callers check the returned norm.
double clip_grad_norm(double* const* grads, const int64_t* sizes, int64_t num_bufs,
                      double max_norm);

// transformers' schedule types (T-OPT get_scheduler):
//   constant              1 (warmup ignored, as HF's "constant")
//   constant_with_warmup  s < W: s / max(1, W); else 1
//   linear                s < W: s / max(1, W); else max(0, (T - s) / max(1, T - W))
//   cosine                s < W: s / max(1, W); else max(0, 0.5 (1 + cos(2 pi num_cycles p)))
//                         with p = (s - W) / max(1, T - W)
enum class LrSchedule { constant, constant_with_warmup, linear, cosine };

// The multiplier on the base learning rate at optimizer step `step` (0-based: step 0 is the
// first update, the counter advances after each update), warmup W, total T.
// Like HF, cosine is not clamped past T (p > 1 rises again); linear is clamped at 0.
double lr_multiplier(LrSchedule schedule, int64_t step, int64_t warmup_steps, int64_t total_steps,
                     double num_cycles = 0.5);

}  // namespace forja::ref
