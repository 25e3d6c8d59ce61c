// One optimizer step of LoRA training, the one the trainer, `forja bench` and the tests run:
// zero the gradients, each micro-batch's forward and backward (the gradients accumulate, already
// scaled by 1/n for the step's n loss tokens), the loss, the sum over data-parallel ranks (a
// hook), the global gradient norm, then AdamW. The loss and the norm are downloaded before AdamW
// is applied, and a step whose loss or norm is not finite leaves the parameters untouched: the
// caller decides whether to stop or to go on (forja train --skip-nonfinite). In one process the
// host waits for the GPU once per step, for those two numbers (the token arrays go into the
// command stream, Context::update); data-parallel steps wait for the loss and the norm apart, the
// sum over the ranks between them.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "gpu/context.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "train/optimizer.h"

namespace forja::train {

// What a step runs on.
struct StepEngine {
  gpu::Context& ctx;
  model::Transformer& tf;
  model::LoraSet& lora;
  AdamW& adamw;
  gpu::Buffer loss_sum;  // one fp32: the micro-batches' summed loss lands here
};

// One micro-batch of a step.
struct MicroBatch {
  const model::TokenBatch* tokens;
  // Its place among the step's micro-batches (all ranks' together): picks its dropout stream,
  // so a resumed or distributed run draws the masks an uninterrupted single process would.
  uint64_t index = 0;
};

struct StepInput {
  int64_t step = 0;                       // 0-based: the schedule's position and the dropout stream's
  std::vector<MicroBatch> micro_batches;  // this process's, in order
  uint64_t targets = 0;                   // loss tokens of the whole step (every rank's): the loss is their mean
  uint64_t dropout_seed = 0;              // --seed
};

// What some callers do inside a step; each may be left empty.
struct StepHooks {
  // After each micro-batch's forward and backward are recorded (the trainer's kill point).
  std::function<void()> after_micro_batch;
  // The sum over data-parallel ranks: gets this process's summed loss, sums lora.grads() over
  // the ranks in place and returns every rank's summed loss (dist/world.h). Empty: one process.
  std::function<double(double loss_sum)> reduce;
  // When the gradients are final, before the norm and AdamW (tests read them here).
  std::function<void()> gradients_ready;
};

struct StepResult {
  double loss = 0;       // mean over the step's loss tokens
  double grad_norm = 0;  // global L2 norm of the gradients, before clipping
  double lr = 0;         // the schedule's learning rate of this step
  bool applied = false;  // loss and norm were finite, and AdamW updated the parameters
};

// Runs step `in.step` (see above). AdamW's update is recorded, not waited for: the next download
// (or ctx.finish()) waits for it.
StepResult step(const StepEngine& engine, const StepInput& in, const StepHooks& hooks = {});

}  // namespace forja::train
