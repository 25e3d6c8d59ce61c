#include "model/flops.h"

namespace forja::model {

StepFlops training_step_flops(const ModelConfig& c, int64_t batch, int64_t seq_len, int64_t lora_rank,
                              const std::vector<LinearKind>& targets) {
  const double T = double(batch) * double(seq_len);
  double linear = 0, lora = 0;
  for (LinearKind k : kAllLinears) {
    const LinearShape s = linear_shape(c, k);
    linear += double(s.out_features) * double(s.in_features);
  }
  for (LinearKind k : targets) {
    const LinearShape s = linear_shape(c, k);
    lora += double(lora_rank) * double(s.in_features + s.out_features);
  }
  const double L = double(c.num_layers);
  const double head = double(c.vocab_size) * double(c.hidden_size);
  StepFlops f;
  f.base_forward = 2 * T * (L * linear + head);
  f.base_backward = 2 * T * (L * linear + head);
  f.lora = 6 * T * L * lora;
  f.attention = 6 * L * double(batch) * double(seq_len) * double(seq_len) * double(c.num_heads) * double(c.head_dim);
  return f;
}

const char* training_step_flops_formula() {
  return "model FLOPs/step = 4*T*(N_linear + V*H) + 6*T*N_lora + 6*L*B*S^2*heads*head_dim "
         "(T = B*S; frozen base: forward + input gradients; causal attention halved; "
         "checkpointing recompute not counted)";
}

}  // namespace forja::model
