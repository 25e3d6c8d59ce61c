// What a model costs in bytes: its weights in 16-bit and in NF4 (with and without double
// quantisation), and an up-front estimate of the GPU memory of a QLoRA training run (design.md
// "Plan memory up front"). Used by `forja inspect` and to size allocations before loading.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace forja::model {

// Exact bytes of one tensor of `numel` elements in NF4 (formats.md §3.2-3.4): packed nibbles,
// plus fp32 absmax per 64, or with double quantisation uint8 per 64 + fp32 per 256 blocks + the
// fp32 offset. The shared code tables (64 + 1024 bytes) are not included.
std::uint64_t nf4_bytes(std::int64_t numel, bool double_quant);

struct WeightBytes {
  std::uint64_t linear_16bit = 0;   // all projection weights in bf16
  std::uint64_t linear_nf4 = 0;     // the same in NF4, fp32 absmax
  std::uint64_t linear_nf4_dq = 0;  // NF4 with double quantisation
  std::uint64_t embedding_16bit = 0;
  std::uint64_t lm_head_16bit = 0;  // 0 when tied (shares the embedding)
  std::uint64_t small_16bit = 0;    // norms and biases in bf16
  std::uint64_t total_16bit() const {
    return linear_16bit + embedding_16bit + lm_head_16bit + small_16bit;
  }
};
WeightBytes weight_bytes(const ModelConfig& c);

struct TrainingSettings {
  std::int64_t batch = 1;
  std::int64_t seq_len = 2048;
  std::int64_t lora_rank = 16;
  std::vector<LinearKind> targets = {std::begin(kAllLinears), std::end(kAllLinears)};
  bool double_quant = true;
  bool nf4 = true;                // projection weights in NF4 (--quant nf4), else dense
  std::int64_t dense_weight_bytes = 2;  // embedding, LM head and dense projections: 2 (16-bit) or 4 (fp32)
  bool checkpointing = true;          // keep each layer's input only, recompute inside it
  std::int64_t vocab_chunk = 8192;  // LM head + cross-entropy processed this many columns at a time
  double lora_dropout = 0.0;        // > 0 adds the dropout scratch (model/transformer.h)
  // Mixed precision: attention's backward runs the fused kernels (ops::attention_fused_backward_enabled),
  // whose scratch is the fp16 copies, not the GEMM path's chunks of scores.
  bool fused_attention_backward = false;
  // and it takes q and k as the fp16 copies the forward made (model::attention_keeps_fp16_qk), so
  // its scratch holds no copies of them.
  bool attention_qk_f16 = false;
  // Checkpointing keeps each layer's attention output (the fp16 copy o_proj reads) and
  // log-sum-exp, so the recomputation skips attention's forward, where keeps_attention_outputs
  // says the engine can (TransformerOptions::keep_attention; choose_kept_activations decides).
  bool keep_attention = true;
  // and each layer's LoRA inputs t, so the recomputation runs no x A^T product
  // (TransformerOptions::keep_lora_inputs; keeps_lora_inputs).
  bool keep_lora_inputs = true;
};

struct MemoryPart {
  std::string name;
  std::uint64_t bytes = 0;
  std::string note;
};

struct MemoryPlan {
  std::vector<MemoryPart> parts;
  std::int64_t lora_parameters = 0;
  std::uint64_t total() const;
};

// The estimate: frozen weights (NF4 linears, 16-bit embedding/LM head, fp32 norms and biases),
// LoRA parameters + gradients + two AdamW moments (fp32), the engine's activation buffers (the
// residual stream, the block table's saved tensors of every layer or, with checkpointing, of one,
// the activation gradients: model/block.h, fp32 in both precisions), mixed precision's fp16
// copies and scratches, and the transient scratch of one step (one vocabulary chunk of logits,
// attention's scratch).
MemoryPlan plan_training_memory(const ModelConfig& c, const TrainingSettings& s);

// Whether the engine keeps the attention outputs across checkpointing for these settings
// (TransformerOptions::keep_attention, which the Transformer decides the same way): checkpointing,
// keep_attention asked, mixed precision with the fused attention backward, no LoRA dropout, and
// o_proj's product able to read the fp16 copy (LoRA on it folded into NF4 products, or none).
bool keeps_attention_outputs(const ModelConfig& c, const TrainingSettings& s);

// Whether the engine keeps the LoRA inputs t across checkpointing for these settings
// (TransformerOptions::keep_lora_inputs): checkpointing, keep_lora_inputs asked, and LoRA.
bool keeps_lora_inputs(const ModelConfig& c, const TrainingSettings& s);

// Sets s.keep_attention: off where FORJA_KEEP_ATTENTION=0 or where the plan with the kept outputs
// exceeds 3/4 of `device_bytes` (a card the run fills anyway keeps its memory for the rest; 0 =
// unknown: kept), else left as asked. And s.keep_lora_inputs: off where FORJA_KEEP_LORA_INPUTS=0
// (their 448 bytes per token and layer at r16 on all seven need no such rule).
void choose_kept_activations(const ModelConfig& c, TrainingSettings& s, std::uint64_t device_bytes);

// fp32 activation elements saved per token by one layer for its backward (the block table's
// saved tensors, model/block.h).
std::int64_t saved_activation_elements_per_token(const ModelConfig& c, const TrainingSettings& s);

}  // namespace forja::model
