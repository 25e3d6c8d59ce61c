// One decoder layer, described once (issue 18):
// - its activation tensors in one table (as llm.c's activation table): what the forward writes and
//   the training engine keeps per layer for the backward (`saved`), and the activation gradients
//   in flight that all layers share (`gradient`), each with its fp32 elements per token. The
//   Transformer and the Generator allocate their buffers from it (allocate_block_acts) and the
//   memory plan sums it (model/memory_plan.cpp), so none can disagree about them;
// - its forward, block_forward: the one sequence of ops of a layer, used by training
//   (model/transformer.cpp, with its own projections and attention kernels) and by generation
//   (model/generator.cpp, with a KV cache), which differ only in the steps of BlockSteps.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "gpu/context.h"
#include "model/base_weights.h"
#include "model/config.h"

namespace forja::model {

enum class BlockRole { saved, gradient };

struct BlockTensor {
  const char* name;  // also the buffer's allocation name (FORJA_ARENA_PEAK shows it)
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

// The K columns a product folding LoRA gives its factor (Transformer::lora_folds): the rank
// rounded up to whole 64-deep K tiles, the largest the GEMM kernels take.
uint32_t lora_fold_pad(int64_t rank);

// Mixed precision dequantises each NF4 projection W [out, in] to fp16 before its products, into
// a slot per projection kind (model/transformer_linear.cpp) laid out as both folds read it: rows
// [W | s B ; A | 0], the forward taking [W | s B] with K = in + fold and the backward [W ; A]
// with K = out + fold (fold: the LoRA rank rounded up to 64, 0 without LoRA), at the row stride
// dequantised_ld(in, fold) = in + max(fold, 64). A stride of a multiple of 1024 halves (Qwen3-4B's
// o_proj, every 4096-wide Llama projection) made the backward's dx = dy W read W's [K, N] tiles
// at 41-95 TFLOP/s on an H100 instead of 229-314 (docs/benchmarks.md); 64 halves of padding per
// row take the rows off the same cache sets. Every width is padded alike, so the small test
// models run the same path.
uint32_t dequantised_ld(uint32_t in, uint32_t fold);
// A projection's slot in bytes (rounded up to 4 KiB, so that every slot starts aligned for a
// binding), and the slots of `config`'s seven projections together.
uint64_t dequantised_slot_bytes(uint64_t out, uint32_t in, uint32_t fold);
uint64_t dequantised_scratch_bytes(const ModelConfig& config, uint32_t fold);

// The saved tensors of one layer as buffers (fp32; shapes for T tokens).
struct BlockActs {
  gpu::Buffer h1, rstd1;       // [T, H], [T]        input norm
  gpu::Buffer q_raw, k_raw;    // [T, nh*d], [T, nkv*d] projections before the q/k norm (Qwen3)
  gpu::Buffer rstd_q, rstd_k;  // [T*nh], [T*nkv]
  gpu::Buffer q, k, v;         // after norm and RoPE (what attention saw)
  gpu::Buffer att, lse;        // [T, nh*d], [B, nh, S]
  gpu::Buffer x2, h2, rstd2;   // residual after attention, post-attention norm
  gpu::Buffer g, u, act;       // [T, I] gate, up, silu(gate) * up
  gpu::Buffer t;               // LoRA x A^T of every target, [T, lora_width]
};

// One BlockActs for `tokens` tokens, each buffer from `alloc(bytes, table name)`.
BlockActs allocate_block_acts(const ModelConfig& config, int64_t lora_width, uint64_t tokens,
                              const std::function<gpu::Buffer(uint64_t, const char*)>& alloc);

// The steps of a layer's forward that differ between the engines that run it.
class BlockSteps {
 public:
  virtual ~BlockSteps() = default;
  // y = (accumulate: y +) the projection `kind` of x: base product, bias, LoRA.
  virtual void linear(LinearKind kind, const gpu::Buffer& x, const gpu::Buffer& y, bool accumulate) = 0;
  // a.att (and a.lse where kept) from a.q, a.k, a.v after RoPE: the attention implementation
  // (tiled, matrix-core, fused, or against a KV cache).
  virtual void attention(const BlockActs& a) = 0;
  // y = rmsnorm(x) w [tokens, cols] and its rstd: the norm before attention (h1) or before the MLP
  // (mlp: h2). An engine may keep y in another form (the training engine: the fp16 copy its
  // projections read, in y's own buffer).
  virtual void norm(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, const gpu::Buffer& y,
                    const gpu::Buffer& rstd, uint32_t tokens, uint32_t cols, float eps, bool mlp);
  // a.q and a.k for attention: Qwen3's q/k norm (from a.q_raw, a.k_raw) where the model has one,
  // then RoPE at `positions`. An engine may keep them in another form (the training engine: the
  // fp16 copies its fused attention reads, model::attention_keeps_fp16_qk).
  virtual void position(gpu::Context& ctx, const BaseWeights& base, size_t layer, uint32_t tokens,
                        const gpu::Buffer& positions, const BlockActs& a);
  // act = silu(a.g) * a.u over [tokens, cols]. An engine may keep it in another form (the training
  // engine: the fp16 copy its down projection reads, in act's own buffer).
  virtual void activation(gpu::Context& ctx, const BlockActs& a, uint32_t tokens, uint32_t cols);
  // Called instead of the down projection when block_forward has no output (a recomputation for
  // the backward): whatever the engine keeps of the down projection's input `act`.
  virtual void down_input(const gpu::Buffer& act) { (void)act; }
};

// Layer `layer` over `tokens` tokens at RoPE `positions` (int32 [tokens]):
//   h1 = rmsnorm(x_in); q, k, v = proj(h1); [q/k norm]; rope(q, k); att = attention(q, k, v);
//   x2 = x_in + o_proj(att); h2 = rmsnorm(x2); act = silu(gate(h2)) * up(h2);
//   x_out = x2 + down(act)        (x_out null: steps.down_input(act) instead)
// writing the saved tensors of `a`. x_out may be x_in (generation updates its residual in place).
void block_forward(gpu::Context& ctx, const BaseWeights& base, size_t layer, uint32_t tokens,
                   const gpu::Buffer& positions, const gpu::Buffer& x_in, const BlockActs& a, const gpu::Buffer* x_out,
                   BlockSteps& steps);

}  // namespace forja::model
