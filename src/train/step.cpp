#include "train/step.h"

#include <algorithm>
#include <cmath>

namespace forja::train {

StepResult step(const StepEngine& e, const StepInput& in, const StepHooks& hooks) {
  e.lora.zero_grads();
  e.tf.reset_fp16_range_check();  // what fp16_range_report tells of this step
  e.ctx.fill(e.loss_sum, 0);
  const float inv_n = 1.0f / float(std::max<uint64_t>(1, in.targets));
  for (const MicroBatch& mb : in.micro_batches) {
    // dropout masks: a fresh stream per (step, micro-batch), reproduced exactly on resume
    e.tf.set_dropout_seed(in.dropout_seed, uint64_t(in.step), mb.index);
    e.tf.run(*mb.tokens, inv_n, e.loss_sum, true);
    if (hooks.after_micro_batch) hooks.after_micro_batch();
  }
  StepResult r;
  if (!hooks.reduce && !hooks.gradients_ready) {
    // One process: the norm is recorded right behind the micro-batches and both numbers come back
    // in one wait, the only one of the step.
    e.adamw.compute_grad_norm();
    float loss_sum = 0, norm = 0;
    e.ctx.download({{e.loss_sum, &loss_sum, 4}, {e.adamw.grad_norm(), &norm, 4}});
    r.loss = double(loss_sum) * double(inv_n);
    r.grad_norm = double(norm);
  } else {
    // Data-parallel: the loss and the gradients are summed over the ranks before the norm.
    double loss_sum = double(e.ctx.download<float>(e.loss_sum, 1)[0]);
    if (hooks.reduce) loss_sum = hooks.reduce(loss_sum);
    r.loss = loss_sum * double(inv_n);
    if (hooks.gradients_ready) hooks.gradients_ready();
    e.adamw.compute_grad_norm();
    r.grad_norm = double(e.ctx.download<float>(e.adamw.grad_norm(), 1)[0]);
  }
  r.lr = e.adamw.lr_at(in.step);
  // The parameters see only finite steps; every rank has the same loss and norm, so all agree.
  r.applied = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  if (r.applied) e.adamw.apply(in.step);
  return r;
}

}  // namespace forja::train
