// Optimizer references. See adamw_ref.h.
#include "ops/ref/adamw_ref.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ops/ref/check_ref.h"
#include "ops/ref/elementwise_ref.h"

namespace forja::ref {

void adamw_step(double* param, double* m, double* v, const double* grad, int64_t n, int64_t t,
                double lr, double beta1, double beta2, double eps, double weight_decay) {
  detail::require_dims("adamw_step", {n});
  detail::require(t >= 1, "adamw_step", "step t is 1-based");
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  const double step_size = lr / bc1;
  const double sqrt_bc2 = std::sqrt(bc2);
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    param[i] *= 1.0 - lr * weight_decay;
    m[i] = beta1 * m[i] + (1.0 - beta1) * g;
    v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
    const double denom = std::sqrt(v[i]) / sqrt_bc2 + eps;
    param[i] -= step_size * m[i] / denom;
  }
}

double clip_grad_norm(double* const* grads, const int64_t* sizes, int64_t num_bufs,
                      double max_norm) {
  const double total = global_l2_norm(grads, sizes, num_bufs);
  const double coef = std::min(1.0, max_norm / (total + 1e-6));
  for (int64_t b = 0; b < num_bufs; ++b) {
    for (int64_t i = 0; i < sizes[b]; ++i) grads[b][i] *= coef;
  }
  return total;
}

double lr_multiplier(LrSchedule schedule, int64_t step, int64_t warmup_steps, int64_t total_steps,
                     double num_cycles) {
  detail::require(step >= 0 && warmup_steps >= 0 && total_steps >= 0, "lr_multiplier",
                  "step, warmup and total must be non-negative");
  const auto d = [](int64_t x) { return static_cast<double>(x); };
  if (schedule == LrSchedule::constant) return 1.0;
  if (step < warmup_steps) return d(step) / d(std::max<int64_t>(1, warmup_steps));
  switch (schedule) {
    case LrSchedule::constant_with_warmup:
      return 1.0;
    case LrSchedule::linear:
      return std::max(0.0,
                      d(total_steps - step) / d(std::max<int64_t>(1, total_steps - warmup_steps)));
    case LrSchedule::cosine: {
      const double p = d(step - warmup_steps) / d(std::max<int64_t>(1, total_steps - warmup_steps));
      return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * p)));
    }
    case LrSchedule::constant:
      break;
  }
  return 1.0;
}

}  // namespace forja::ref
