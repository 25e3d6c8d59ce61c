// One optimizer step over the LoRA parameters, entirely on the GPU: the global gradient norm
// (formats.md 6.3), clipping folded into AdamW (6.2), the schedule's learning rate (6.4).
// AdamW's moments are fp32 buffers with the parameters' layout.
#pragma once
#include <cstdint>

#include "gpu/context.h"
#include "model/lora.h"
#include "train/schedule.h"

namespace forja::train {

struct OptimizerSettings {
  double lr = 2e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 0.3;  // <= 0: no clipping
  Schedule schedule = Schedule::constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
};

class AdamW {
 public:
  AdamW(gpu::Context& ctx, model::LoraSet& lora, const OptimizerSettings& settings);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // The unclipped global norm of the accumulated gradients, into grad_norm()[0] on the GPU.
  void compute_grad_norm();
  // Clips (by grad_norm()) and applies the accumulated gradients as optimizer step `step`
  // (0-based). train::step (train/step.h) calls the two, checking the norm in between.
  void apply(int64_t step);
  double lr_at(int64_t step) const;
  // The schedule's length (a resumed run may change it with --max-steps).
  void set_schedule_length(int64_t total_steps, int64_t warmup_steps) {
    settings_.total_steps = total_steps;
    settings_.warmup_steps = warmup_steps;
  }
  gpu::Buffer grad_norm() const { return norm_; }
  gpu::Buffer m() const { return m_; }
  gpu::Buffer v() const { return v_; }
  const OptimizerSettings& settings() const { return settings_; }

 private:
  gpu::Context& ctx_;
  model::LoraSet& lora_;
  OptimizerSettings settings_;
  gpu::Buffer m_, v_, norm_;
};

}  // namespace forja::train
