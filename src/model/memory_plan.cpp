// Byte counts of weights and the training-memory estimate. The activation accounting follows
// the hand-written backward of one decoder layer (docs/formats.md §1.3): what each op's backward
// reads must have been kept from the forward pass.
#include "model/memory_plan.h"

#include "gpu/device.h"
#include "model/block.h"
#include "ops/attention_gemm.h"
#include "ops/cross_entropy.h"

#include <algorithm>
#include <string>

namespace forja::model {

std::uint64_t nf4_bytes(std::int64_t numel, bool double_quant) {
  const std::uint64_t n = static_cast<std::uint64_t>(numel);
  const std::uint64_t blocks = (n + 63) / 64;
  const std::uint64_t packed = (n + 1) / 2;
  if (!double_quant) return packed + 4 * blocks;
  return packed + blocks + 4 * ((blocks + 255) / 256) + 4;
}

WeightBytes weight_bytes(const ModelConfig& c) {
  WeightBytes w;
  for (LinearKind k : kAllLinears) {
    const LinearShape s = linear_shape(c, k);
    const std::int64_t n = s.out_features * s.in_features;
    const std::uint64_t layers = static_cast<std::uint64_t>(c.num_layers);
    w.linear_16bit += layers * 2 * static_cast<std::uint64_t>(n);
    w.linear_nf4 += layers * nf4_bytes(n, false);
    w.linear_nf4_dq += layers * nf4_bytes(n, true);
  }
  const ParameterCounts p = count_parameters(c);
  w.embedding_16bit = 2 * static_cast<std::uint64_t>(p.embedding);
  w.lm_head_16bit = 2 * static_cast<std::uint64_t>(p.lm_head);
  w.small_16bit = 2 * static_cast<std::uint64_t>(p.norm + p.bias);
  return w;
}

std::int64_t lora_width(const TrainingSettings& s) {
  return static_cast<std::int64_t>(s.targets.size()) * s.lora_rank;
}

std::int64_t saved_activation_elements_per_token(const ModelConfig& c, const TrainingSettings& s) {
  return block_elements_per_token(c, lora_width(s), BlockRole::saved);
}

std::uint64_t MemoryPlan::total() const {
  std::uint64_t t = 0;
  for (const MemoryPart& p : parts) t += p.bytes;
  return t;
}

namespace {
// One layer's kept attention output per token (keeps_attention_outputs): the fp16 copy o_proj
// reads, q_dim halves and the LoRA fold's pad beside them (Transformer::lora_pad_: the rank
// rounded up to 64 in mixed precision with any target), and the fp32 log-sum-exp of each head.
std::uint64_t kept_attention_bytes_per_token(const ModelConfig& c, const TrainingSettings& s) {
  const std::uint64_t pad =
      !s.targets.empty() && s.lora_rank > 0 ? lora_fold_pad(s.lora_rank) : 0;
  return (static_cast<std::uint64_t>(c.q_dim()) + pad) * 2 + static_cast<std::uint64_t>(c.num_heads) * 4;
}
}  // namespace

MemoryPlan plan_training_memory(const ModelConfig& c, const TrainingSettings& s) {
  MemoryPlan plan;
  const WeightBytes w = weight_bytes(c);
  const ParameterCounts p = count_parameters(c);
  const std::uint64_t tokens = static_cast<std::uint64_t>(s.batch * s.seq_len);

  // WeightBytes counts 16-bit weights; fp32 ones take dense_weight_bytes / 2 times as much.
  const std::uint64_t dense_bytes = static_cast<std::uint64_t>(s.dense_weight_bytes);
  const std::string dense_name = dense_bytes == 2 ? "16-bit" : std::to_string(8 * dense_bytes) + "-bit";
  if (s.nf4)
    plan.parts.push_back({"NF4 linear weights", s.double_quant ? w.linear_nf4_dq : w.linear_nf4,
                          s.double_quant ? "double quantisation on" : "fp32 absmax"});
  else
    plan.parts.push_back({"linear weights (" + dense_name + ")", w.linear_16bit / 2 * dense_bytes, "not quantised"});
  plan.parts.push_back({"embedding (" + dense_name + ")", w.embedding_16bit / 2 * dense_bytes, ""});
  plan.parts.push_back({"LM head (" + dense_name + ")", w.lm_head_16bit / 2 * dense_bytes,
                        c.tie_word_embeddings ? "tied: shares the embedding" : ""});
  plan.parts.push_back(
      {"norms and biases (fp32)", 4 * static_cast<std::uint64_t>(p.norm + p.bias), ""});

  plan.lora_parameters = lora_parameter_count(c, s.lora_rank, s.targets);
  const std::uint64_t lora = 4 * static_cast<std::uint64_t>(plan.lora_parameters);
  plan.parts.push_back(
      {"LoRA parameters (fp32)", lora, std::to_string(plan.lora_parameters) + " parameters"});
  plan.parts.push_back({"LoRA gradients (fp32)", lora, ""});
  plan.parts.push_back({"AdamW moments (fp32)", 2 * lora, "first and second moment"});

  // The engine's own buffers (model/transformer.cpp), all fp32: the residual stream entering
  // every layer and leaving the last, the block table's saved tensors (model/block.h) for every
  // layer or, with checkpointing, for the one being recomputed, the final norm, the token arrays.
  const std::uint64_t layers = static_cast<std::uint64_t>(c.num_layers);
  const std::uint64_t H = static_cast<std::uint64_t>(c.hidden_size);
  const std::uint64_t saved = static_cast<std::uint64_t>(saved_activation_elements_per_token(c, s));
  const std::uint64_t stream = (layers + 1) * tokens * H * 4;
  const std::uint64_t kept = (s.checkpointing ? 1 : layers) * tokens * saved * 4;
  const std::uint64_t final_norm = tokens * (H + 1) * 4;  // normed rows and their rstd
  const std::uint64_t token_arrays = 4 * tokens * 4;       // ids, targets, positions, segments (int32)
  plan.parts.push_back({"saved activations", stream + kept + final_norm + token_arrays,
                        s.checkpointing ? "checkpointing on: layer inputs + one layer recomputed"
                                        : "checkpointing off: every layer"});
  if (keeps_attention_outputs(c, s))
    plan.parts.push_back({"attention outputs kept", layers * tokens * kept_attention_bytes_per_token(c, s),
                          "fp16 output and log-sum-exp of every layer: no attention forward in the recomputation"});
  if (keeps_lora_inputs(c, s))
    plan.parts.push_back({"LoRA inputs kept", layers * tokens * static_cast<std::uint64_t>(lora_width(s)) * 4,
                          "t = x A^T of every layer: no x A^T product in the recomputation"});
  const std::uint64_t gradients =
      tokens * static_cast<std::uint64_t>(block_elements_per_token(c, lora_width(s), BlockRole::gradient)) * 4;
  plan.parts.push_back({"activation gradients", gradients, "one layer's, shared by all layers"});

  // Mixed precision folds each NF4 projection's LoRA factor into its product, K growing by the
  // rank rounded up to 64 (Transformer::lora_folds): the scratches below are that much wider.
  const std::uint64_t fold =
      s.nf4 && s.dense_weight_bytes == 2 && plan.lora_parameters > 0 ? lora_fold_pad(s.lora_rank) : 0;
  if (s.nf4 && s.dense_weight_bytes == 2) {
    // Mixed precision (16-bit dense weights) dequantises each NF4 projection to fp16 before its
    // product, into a slot per projection kind (model/transformer.h, DequantSlot).
    plan.parts.push_back({"NF4 weights dequantised (fp16)", dequantised_scratch_bytes(c, static_cast<uint32_t>(fold)),
                          "one slot per projection kind, shared by the layers"});
  }
  if (s.dense_weight_bytes == 2) {
    // Mixed precision rounds each base product's input into one fp16 copy (model/transformer.h).
    const std::uint64_t widest_io =
        static_cast<std::uint64_t>(std::max({c.hidden_size, c.intermediate_size, c.q_dim()}));
    plan.parts.push_back({"base product input (fp16)", tokens * (widest_io + fold) * 2, "one product at a time"});
    // and runs LoRA's products on fp16 copies of the factors and of one layer's t (and dt, where
    // the products fold: Transformer::dt16_) (TransformerOptions::LoraProducts).
    if (plan.lora_parameters > 0) {
      const auto t_cols = static_cast<std::uint64_t>(s.lora_rank) * s.targets.size();
      const std::uint64_t copies = fold > 0 ? 2 : 1;
      plan.parts.push_back({"LoRA factors and t (fp16 copies)", lora / 2 + copies * tokens * t_cols * 2,
                            "refreshed every run; t and dt one layer at a time"});
    }
  }
  if (s.lora_dropout > 0) {
    // dropout(x) of one projection input at a time, fp32, in row chunks of at most [tokens, hidden]
    const std::uint64_t widest_in =
        static_cast<std::uint64_t>(std::max({c.intermediate_size, c.q_dim()}));
    plan.parts.push_back({"LoRA dropout scratch",
                          4 * std::max(tokens * static_cast<std::uint64_t>(c.hidden_size), widest_in),
                          "masks are hashed, not stored"});
  }
  // Transient scratch: ops allocate it while they run and free it after, so only the largest
  // counts. The LM head and cross-entropy hold a block of rows of one vocabulary chunk's logits
  // (ops/cross_entropy.h); mixed precision's attention holds one sequence's fp16 copies and a
  // chunk of scores (ops/attention_gemm.h).
  ops::CrossEntropyOptions ce_options;
  ce_options.vocab_chunk = static_cast<std::uint32_t>(s.vocab_chunk);
  const std::uint64_t ce = ops::lm_head_cross_entropy_scratch_bytes(
      static_cast<std::uint32_t>(tokens), static_cast<std::uint32_t>(c.hidden_size),
      static_cast<std::uint32_t>(c.vocab_size), dense_bytes == 2, UINT64_MAX, ce_options);
  std::uint64_t attention = 0;
  std::uint32_t attention_rows = 0;
  const auto nh = static_cast<std::uint32_t>(c.num_heads), seq = static_cast<std::uint32_t>(s.seq_len);
  std::string attention_note;
  if (dense_bytes == 2 && s.fused_attention_backward) {
    // every sequence of the batch in one dispatch (a device with a small binding limit splits them)
    attention = ops::attention_fused_scratch_bytes(static_cast<std::uint32_t>(s.batch), seq, nh,
                                                   static_cast<std::uint32_t>(c.num_kv_heads),
                                                   static_cast<std::uint32_t>(c.head_dim), s.attention_qk_f16);
    attention_note = "attention: the fused kernels' fp16 copies";
  } else if (dense_bytes == 2) {
    attention_rows = ops::attention_gemm_chunk_rows(seq, nh, {}, UINT64_MAX);
    attention = ops::attention_gemm_scratch_bytes(seq, nh, static_cast<std::uint32_t>(c.head_dim), attention_rows);
    attention_note = "attention: one sequence, " + std::to_string(attention_rows) + "-query chunks of scores";
  }
  plan.parts.push_back({"scratch (transient)", std::max(ce, attention),
                        ce >= attention ? "the LM head's block of logits" : attention_note});
  return plan;
}

bool keeps_attention_outputs(const ModelConfig& c, const TrainingSettings& s) {
  const bool o_lora = std::find(s.targets.begin(), s.targets.end(), LinearKind::O) != s.targets.end() && s.lora_rank > 0;
  // Transformer::lora_folds for o_proj: NF4, mixed, whole groups of 8 in and out
  const bool o_folds = s.nf4 && c.q_dim() % 8 == 0 && c.hidden_size % 8 == 0;
  return s.checkpointing && s.keep_attention && s.dense_weight_bytes == 2 && s.fused_attention_backward &&
         s.lora_dropout == 0 && (!o_lora || o_folds);
}

bool keeps_lora_inputs(const ModelConfig&, const TrainingSettings& s) {
  return s.checkpointing && s.keep_lora_inputs && lora_width(s) > 0;
}

void choose_kept_activations(const ModelConfig& c, TrainingSettings& s, std::uint64_t device_bytes) {
  if (!gpu::env_flag_default_on("FORJA_KEEP_LORA_INPUTS")) s.keep_lora_inputs = false;
  if (!gpu::env_flag_default_on("FORJA_KEEP_ATTENTION")) s.keep_attention = false;
  if (!keeps_attention_outputs(c, s) || device_bytes == 0) return;
  if (plan_training_memory(c, s).total() > device_bytes / 4 * 3) s.keep_attention = false;
}

}  // namespace forja::model
