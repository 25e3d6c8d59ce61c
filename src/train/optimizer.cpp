#include "train/optimizer.h"

#include "ops/adamw.h"
#include "ops/elementwise.h"

namespace forja::train {

AdamW::AdamW(gpu::Context& ctx, model::LoraSet& lora, const OptimizerSettings& settings)
    : ctx_(ctx), lora_(lora), settings_(settings) {
  const uint64_t n = lora.parameter_count();
  m_ = ctx.alloc(n * 4, "AdamW m");
  v_ = ctx.alloc(n * 4, "AdamW v");
  norm_ = ctx.alloc(16, "gradient norm");
  ctx.fill(m_, 0);
  ctx.fill(v_, 0);
}

AdamW::~AdamW() {
  ctx_.free(m_);
  ctx_.free(v_);
  ctx_.free(norm_);
}

double AdamW::lr_at(int64_t step) const {
  return settings_.lr * lr_multiplier(settings_.schedule, step, settings_.warmup_steps, settings_.total_steps);
}

void AdamW::compute_grad_norm() {
  ops::global_l2_norm(ctx_, {{lora_.grads(), lora_.parameter_count()}}, norm_);
}

void AdamW::apply(int64_t step) {
  const uint64_t n = lora_.parameter_count();
  ops::AdamwParams p;
  p.lr = static_cast<float>(lr_at(step));
  p.beta1 = static_cast<float>(settings_.beta1);
  p.beta2 = static_cast<float>(settings_.beta2);
  p.eps = static_cast<float>(settings_.eps);
  p.weight_decay = static_cast<float>(settings_.weight_decay);
  p.max_grad_norm = static_cast<float>(settings_.max_grad_norm);
  p.grad_scale = 1.0f;
  p.step = static_cast<uint32_t>(step + 1);
  ops::adamw_step(ctx_, lora_.params(), lora_.grads(), m_, v_, n, norm_, p);
}

}  // namespace forja::train
