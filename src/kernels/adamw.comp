#version 450
// One AdamW step (formats.md 6.2) over fp32 parameters with gradient clipping by global norm
// (6.3) folded in, elementwise with a grid stride.          (param, grad, m, v, grad_norm)
//   g     = grad * grad_scale * coef,   coef = min(1, max_norm / (grad_scale * grad_norm[0] + 1e-6))
//           (coef = 1 when max_norm <= 0: clipping off)
//   param = param * (1 - lr wd)                                   (decoupled decay, first)
//   m     = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   param = param - step_size * m / (sqrt(v) / sqrt_bc2 + eps)   (eps after bias correction)
// with step_size = lr / (1 - beta1^t) and sqrt_bc2 = sqrt(1 - beta2^t) from the host (double).
// grad_norm[0] is the L2 norm of the stored gradients (ops::global_l2_norm), so the norm of the
// scaled gradients is grad_scale * grad_norm[0]: loss scaling does not change the clipping.
// A non-finite norm gives an unspecified step (compilers may turn the clamp into min(), which
// drops NaN): the trainer checks the norm before stepping (design.md: stop or skip the step).
//! variant adamw
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint n;  // elements in this dispatch
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps;
  float step_size;  // lr / (1 - beta1^t)
  float sqrt_bc2;   // sqrt(1 - beta2^t)
  float max_grad_norm;
  float grad_scale;
} pc;
layout(set = 0, binding = 0) buffer P { float param[]; };
layout(set = 0, binding = 1) readonly buffer G { float grad[]; };
layout(set = 0, binding = 2) buffer M { float m[]; };
layout(set = 0, binding = 3) buffer V { float v[]; };
layout(set = 0, binding = 4) readonly buffer N { float grad_norm[]; };

void main() {
  float scale = pc.grad_scale;
  if (pc.max_grad_norm > 0.0) {
    const float coef = pc.max_grad_norm / (pc.grad_scale * grad_norm[0] + 1e-6);
    scale *= min(coef, 1.0);
  }
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += gl_NumWorkGroups.x * 256u) {
    const float g = grad[i] * scale;
    const float mi = pc.beta1 * m[i] + pc.one_minus_beta1 * g;
    const float vi = pc.beta2 * v[i] + pc.one_minus_beta2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * pc.decay - pc.step_size * mi / (sqrt(vi) / pc.sqrt_bc2 + pc.eps);
  }
}
