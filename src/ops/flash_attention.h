// Fused causal GQA attention with packed-segment masking, FlashAttention-2 structure
// (kernels/flash_attention.comp): one kernel for the forward, two for the backward, each walking
// tiles of queries and keys with the products on cooperative-matrix fragments (fp16 operands,
// fp32 accumulation) and the softmax in fp32; memory O(S), never an [S, S] matrix, nothing
// through global memory between the products.
//
// Same interface, layouts, mask, lse and gradients as ops/attention.h (the fp32 tiled kernels)
// and ops/attention_gemm.h: q, out, dq, dout fp32 [B*S, nh, d]; k, v, dk, dv fp32 [B*S, nkv, d];
// segments int32 [B*S] (query i sees key j iff j <= i and seg[j] == seg[i] != 0; segment 0 is
// padding: out 0, lse -inf, no gradient); lse fp32 [B, nh, S]. Query head h reads kv head
// h / (nh / nkv). The forward saves lse for the backward; the backward writes dq, dk, dv (=),
// dk and dv of a kv head summed over its query heads, deterministically (no atomics).
//
// Arithmetic (coopmat and coopmat_emulated): q, k, v and dout are rounded to fp16 as they are
// staged, and so are P and dS where they enter a product, as in ops/attention_gemm.h; scores,
// statistics, D = rowsum(dout * out) and every accumulation are fp32. f32 runs the same tiling
// in fp32 throughout (scalar; for tests and comparisons).
//
// head_dim 1..128: the kernels work on whole 16-wide fragments, so a head_dim that is not a
// multiple of 16 runs as the next one with zero columns (flash_attention_supports says whether
// a shape runs on a device: the fp32 variant's backward at head_dim 128 needs more than 32 KiB of
// shared memory).
#pragma once
#include <cstdint>
#include <string>

#include "gpu/context.h"

namespace forja::ops {

// coopmat: GL_NV_cooperative_matrix (NVIDIA); coopmat_emulated: the same tiling with scalar code
// (runs anywhere, lavapipe included; tests); f32: that emulation without fp16 rounding.
// automatic: coopmat where the device has it, else coopmat_emulated. FORJA_NO_COOPMAT=1 turns
// coopmat off, as for the GEMMs.
enum class FlashKernel { automatic, coopmat, coopmat_emulated, f32 };

struct FlashAttentionOptions {
  FlashKernel kernel = FlashKernel::automatic;
  // Query rows and keys per tile (multiples of 16) for all three kernels; 0 = per kernel, the
  // largest of its candidates that fits the device's shared memory.
  uint32_t block_q = 0, block_k = 0;
  // The dk/dv kernel's workgroups per kv head: 1 sums all its query heads in one workgroup; n
  // (a divisor of n_heads / n_kv_heads) gives each workgroup n_heads / n_kv_heads / n of them,
  // writing partial dk, dv that a second kernel sums (deterministic either way; scratch of
  // 2 x B x S x n_kv_heads x n x d fp32). 0 = automatic: the smallest n that gives at least 8
  // workgroups per compute unit, 1 where the device does not say how many it has.
  uint32_t dkdv_head_split = 0;
};

// The tiles (query rows, keys) each kernel runs with.
struct FlashTiles {
  uint32_t fwd_q = 0, fwd_k = 0, dq_q = 0, dq_k = 0, dkdv_q = 0, dkdv_k = 0;
};

bool flash_attention_coopmat_available(const gpu::Context& ctx);
FlashKernel flash_kernel_for(const gpu::Context& ctx, FlashKernel requested = FlashKernel::automatic);
std::string flash_kernel_name(FlashKernel k);

// Whether flash attention runs head_dim on this device with these options (head_dim 1..128, the
// kernel present, tiles that fit shared memory).
bool flash_attention_supports(const gpu::Context& ctx, uint32_t head_dim, const FlashAttentionOptions& options = {});
// The tiles for head_dim; throws std::invalid_argument (saying why) where it is not supported.
FlashTiles flash_attention_tiles(const gpu::Context& ctx, uint32_t head_dim, const FlashAttentionOptions& options = {});

// The dk/dv kernel's workgroups per kv head for this shape (FlashAttentionOptions::dkdv_head_split
// resolved); throws std::invalid_argument when a forced split does not divide nh / nkv.
uint32_t flash_attention_dkdv_split(const gpu::Context& ctx, uint32_t batch, uint32_t seq, uint32_t n_heads,
                                    uint32_t n_kv_heads, uint32_t head_dim, const FlashAttentionOptions& options = {});

void flash_attention_forward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                             const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                             uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                             float scale, const FlashAttentionOptions& options = {});

// Two dispatches: flash_bwd_dq (dq, and D = rowsum(dout * out) into a scratch [B, nh, S]), then
// flash_bwd_dkdv (dk, dv per key tile, summing the query heads of each kv head); with a head
// split (FlashAttentionOptions::dkdv_head_split) two more that sum its partial dk and dv.
void flash_attention_backward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                              const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                              const gpu::Buffer& dout, const gpu::Buffer& dq, const gpu::Buffer& dk,
                              const gpu::Buffer& dv, uint32_t batch, uint32_t seq, uint32_t n_heads,
                              uint32_t n_kv_heads, uint32_t head_dim, float scale,
                              const FlashAttentionOptions& options = {});

}  // namespace forja::ops
