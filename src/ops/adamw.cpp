#include "ops/adamw.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/kernel_table.h"

namespace forja::ops {

namespace {

// Push constants of kernels/adamw.comp.
struct AdamwPush {
  uint32_t n;
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps;
  float step_size;  // lr / (1 - beta1^t)
  float sqrt_bc2;   // sqrt(1 - beta2^t)
  float max_grad_norm;
  float grad_scale;
};
static_assert(kernels::push_block_matches<AdamwPush>(kernels::adamw),
              "AdamwPush differs from kernels/adamw.comp's push-constant block");

constexpr uint32_t kAdamwThreads = 256;
constexpr uint32_t kAdamwMaxGroups = 4096;  // the kernel's grid-stride loop covers the rest

}  // namespace

void adamw_step(gpu::Context& ctx, const gpu::Buffer& param, const gpu::Buffer& grad, const gpu::Buffer& m,
                const gpu::Buffer& v, uint64_t n, const gpu::Buffer& grad_norm, const AdamwParams& p) {
  if (p.step < 1) throw std::logic_error("adamw_step: step is 1-based");
  if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f && p.beta2 >= 0.0f && p.beta2 < 1.0f))
    throw std::logic_error("adamw_step: betas must lie in [0, 1)");
  if (n == 0) return;
  const std::pair<const char*, const gpu::Buffer*> arrays[] = {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}};
  for (const auto& [name, b] : arrays)
    if (b->size < n * 4)
      throw std::logic_error(std::string("adamw_step: ") + name + " holds " + std::to_string(b->size) +
                             " bytes, n = " + std::to_string(n) + " needs " + std::to_string(n * 4));
  if (grad_norm.size < 4) throw std::logic_error("adamw_step: grad_norm must hold one fp32");

  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  AdamwPush push{};
  push.decay = static_cast<float>(1.0 - double(p.lr) * double(p.weight_decay));
  push.beta1 = p.beta1;
  push.one_minus_beta1 = static_cast<float>(1.0 - double(p.beta1));
  push.beta2 = p.beta2;
  push.one_minus_beta2 = static_cast<float>(1.0 - double(p.beta2));
  push.eps = p.eps;
  push.step_size = static_cast<float>(double(p.lr) / bc1);
  push.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  push.max_grad_norm = p.max_grad_norm;
  push.grad_scale = p.grad_scale;

  const auto& pipe = ctx.pipelines().get(kernels::adamw);
  // Chunks that fit one binding and start at aligned offsets.
  const uint64_t align = std::max<uint64_t>(16, ctx.info().min_storage_offset_alignment);
  const uint64_t chunk = std::min<uint64_t>(ctx.info().max_storage_buffer_range, 1ull << 31) / align * align / 4;
  const gpu::Buffer norm = grad_norm.slice(0, std::min<uint64_t>(grad_norm.size, 16));
  for (uint64_t start = 0; start < n; start += chunk) {
    const uint64_t len = std::min(chunk, n - start);
    push.n = static_cast<uint32_t>(len);
    const uint32_t groups = static_cast<uint32_t>(std::min<uint64_t>((len + kAdamwThreads - 1) / kAdamwThreads, kAdamwMaxGroups));
    ctx.dispatch(pipe,
                 {{param.slice(start * 4, len * 4), gpu::Access::read_write},
                  {grad.slice(start * 4, len * 4), gpu::Access::read},
                  {m.slice(start * 4, len * 4), gpu::Access::read_write},
                  {v.slice(start * 4, len * 4), gpu::Access::read_write},
                  {norm, gpu::Access::read}},
                 push, groups, 1, 1, "adamw_step", 16.0 * double(len));
  }
}

}  // namespace forja::ops
