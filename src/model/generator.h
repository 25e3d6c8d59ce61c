// Inference with a KV cache on the GPU: the frozen base (model/base_weights.h) with an optional
// LoRA adapter applied unmerged (y = base(x) + scale (x A^T) B^T, as in training), each layer by
// the training engine's own block_forward (model/block.h), but tokens are fed in chunks that
// extend a per-layer cache of keys and values instead of whole sequences.
//
//   prefill:  forward(prompt)   -> logits of the last prompt token (chunks of max_chunk tokens)
//   decode:   forward({token})  -> logits of that token, one token at a time
//
// Cache: per layer, K and V fp32 [max_context, n_kv_heads, head_dim] (position-major, so a
// chunk's keys land in one contiguous copy); attention of a chunk against it is
// ops::cached_attention. Logits only for the rows asked for: the LM head GEMM [rows, H] x [V, H]^T,
// usually rows = 1. Sliding-window attention is not implemented: the caller keeps the context
// within the config's window.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gpu/context.h"
#include "model/base_weights.h"
#include "model/block.h"
#include "model/lora.h"

namespace forja::model {

class Generator {
 public:
  // lora may be null (base model only). Throws UserError when the cache does not fit the
  // device's binding limit (choose a shorter context).
  Generator(gpu::Context& ctx, const BaseWeights& base, const LoraSet* lora, uint32_t max_context,
            uint32_t max_chunk = 256);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  uint32_t position() const { return position_; }  // tokens in the cache
  uint32_t max_context() const { return max_context_; }
  // Forgets cached tokens from position `keep` on (keep <= position()).
  void truncate(uint32_t keep);

  // Appends `tokens` at positions position(), position()+1, ... and returns the logits (fp32) of
  // the last one [V], or with all_logits of every one [n, V] row-major. Throws UserError when the
  // context would exceed max_context().
  std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits = false);

 private:
  void forward_chunk(const int32_t* ids, uint32_t n, bool all_logits, std::vector<float>* logits);
  class Steps;
  gpu::Buffer alloc(uint64_t bytes, const char* what);

  gpu::Context& ctx_;
  const BaseWeights& base_;
  const LoraSet* lora_;
  ModelConfig c_;
  uint32_t max_context_, max_chunk_, logit_rows_;
  uint32_t position_ = 0;
  gpu::Buffer ids_, positions_, x_, h_, rstd_, logits_;
  BlockActs acts_;  // one layer's tensors for a chunk (block table), reused by every layer
  std::vector<gpu::Buffer> k_cache_, v_cache_;
  std::vector<gpu::Buffer> owned_;
};

// How a generation ended.
enum class StopReason { eos, max_tokens, context_full };

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated, including the stop token when one ended it
  StopReason reason = StopReason::max_tokens;
};

// Feeds `prompt` (after what the generator already holds) and generates up to max_new_tokens,
// choosing each token with `choose` (from the logits [V]) and calling `on_token` as soon as it
// is chosen; stops after a token in `stop_ids`. The stop token is fed to the cache only when
// generation goes on (it is not, so a chat's next turn re-feeds the template's own text).
GenerationResult generate(Generator& gen, std::span<const int32_t> prompt, uint32_t max_new_tokens,
                          std::span<const int32_t> stop_ids,
                          const std::function<int32_t(std::span<const float>)>& choose,
                          const std::function<void(int32_t)>& on_token);

}  // namespace forja::model
