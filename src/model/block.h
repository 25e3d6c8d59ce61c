// One decoder layer's activation tensors in one table (issue 18, as llm.c's activation table):
// what the training engine keeps per layer for the backward (`saved`) and the activation
// gradients in flight that all layers share (`gradient`), each with its fp32 elements per token.
// The Transformer allocates its buffers from this table (model/transformer.cpp) and the memory
// plan sums it (model/memory_plan.cpp), so the two cannot disagree about them.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace forja::model {

enum class BlockRole { saved, gradient };

struct BlockTensor {
  const char* name;   // also the buffer's allocation name (FORJA_ARENA_PEAK shows it)
  BlockRole role;
  int64_t per_token;  // fp32 elements per token
};

// The tensors of one layer of `config` with `lora_width` = LoRA targets x rank columns of the
// LoRA buffers (0: no LoRA), present ones only, in the order the engine allocates them:
//   saved:    h1, rstd1, [q_raw, k_raw, rstd_q, rstd_k with q/k norm], q, k, v, attention out,
//             attention lse, x2, h2, rstd2, gate, up, swiglu, lora t
//   gradient: dx, dh, datt, dq, dk, dv, [dq_raw, dk_raw with q/k norm], dgate, dup, dswiglu,
//             lora dt
std::vector<BlockTensor> block_tensors(const ModelConfig& config, int64_t lora_width);

// Elements per token of one role, summed.
int64_t block_elements_per_token(const ModelConfig& config, int64_t lora_width, BlockRole role);

}  // namespace forja::model
