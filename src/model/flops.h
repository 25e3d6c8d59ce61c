// Model FLOPs of one QLoRA training step (forward + backward), for the model FLOP utilisation
// (MFU) that `forja bench` reports. Counted as the usual "6 N per token" adapted to a frozen base
// with LoRA adapters, matrix products only (norms, activations, RoPE, softmax and the optimizer
// are left out, as is customary), each multiply-add counted as 2 FLOPs. For T = B * S tokens:
//
//   base forward      2 * T * (N_linear + V*H)      every projection, and the LM head
//   base backward     2 * T * (N_linear + V*H)      input gradients only: the frozen base has no
//                                                   weight gradients (the "4 N" of the usual 6 N)
//   LoRA              6 * T * N_lora                N_lora = sum over adapters of r * (in + out):
//                                                   forward x A^T, t B^T; backward dB, dt, dA, dx
//   attention         6 * L * B * S^2 * nh * d      forward Q K^T and P V (4 S^2 d per head),
//                                                   backward dV, dP, dQ, dK (8 S^2 d per head),
//                                                   halved for the causal mask (the usual S^2 / 2)
//
// N_linear = L * sum of the seven projections' out * in; the LM head counts even when tied to
// the embedding (the product is done either way); the embedding lookup is a gather (0 FLOPs).
// Work the implementation does but the model does not need is not counted: recomputing layers
// for activation checkpointing, recomputing attention probabilities in its backward.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace forja::model {

struct StepFlops {
  double base_forward = 0;
  double base_backward = 0;
  double lora = 0;
  double attention = 0;
  double total() const { return base_forward + base_backward + lora + attention; }
};

StepFlops training_step_flops(const ModelConfig& c, int64_t batch, int64_t seq_len, int64_t lora_rank,
                              const std::vector<LinearKind>& targets);

// The formula above in one line, for printing next to the figure.
const char* training_step_flops_formula();

}  // namespace forja::model
