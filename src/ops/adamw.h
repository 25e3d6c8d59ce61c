// One AdamW step with gradient clipping folded in (formats.md 6.2, 6.3; kernels/adamw.comp),
// over n fp32 parameters with fp32 gradients and fp32 moments m, v (updated in place).
#pragma once
#include <cstdint>

#include "gpu/context.h"

namespace forja::ops {

struct AdamwParams {
  float lr, beta1, beta2, eps, weight_decay;
  float max_grad_norm;  // clip to this global norm; <= 0 disables clipping
  float grad_scale;     // multiplies the gradients first (1 / loss_scale; 1 normally)
  uint32_t step;        // 1-based: the first update is step 1
};

// For every i < n, with g = grad[i] * grad_scale * coef and
//   coef = min(1, max_grad_norm / (grad_scale * grad_norm[0] + 1e-6))   (1 when clipping is off):
//   param *= 1 - lr * weight_decay;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
//   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
// grad_norm[0] (fp32) is the global L2 norm of the gradients as stored, from
// ops::global_l2_norm over all trainable gradients; the kernel scales it by grad_scale, so the
// clipping sees the norm of the unscaled gradients. The bias corrections are computed here in
// double. The step runs on the GPU without a host round trip; the trainer reads grad_norm
// separately to log it and must not step on a non-finite norm (the update is then
// unspecified). Arrays larger than the binding limit are processed in chunks.
void adamw_step(gpu::Context& ctx, const gpu::Buffer& param, const gpu::Buffer& grad, const gpu::Buffer& m,
                const gpu::Buffer& v, uint64_t n, const gpu::Buffer& grad_norm, const AdamwParams& p);

}  // namespace forja::ops
