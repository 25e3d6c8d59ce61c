// Causal GQA attention computed through the GEMM kernels, for mixed precision: the six products
// of attention (Q K^T, P V forward; dO V^T, dS K, dS^T Q, P^T dO backward) run as batched GEMMs
// over the query heads with fp16 operands and fp32 accumulation, on matrix cores where the device
// has them (ops/gemm.h), and small kernels (kernels/attention_gemm.comp) do the softmax between
// them. Same semantics, layouts, mask and lse as ops/attention.h; the arithmetic differs as
// flash-attention's fp16 mode does: q, k, v, dout, P and dS are rounded to fp16 where they enter
// a product, statistics and the softmax stay fp32.
//
// Memory: the queries of a sequence are taken in chunks of C rows, each against the keys up to
// the chunk's end (causality skips the rest), so the scratch holds one chunk's scores [nh, C, S]
// rather than [S, S]: O(S) for a fixed C, with C chosen from a byte budget. Every sequence of a
// batch is its own set of chunks.
//
// Backward: dq is written per chunk; dk and dv are accumulated per query head over the chunks (in
// fp32, [nh, S, d]) and then summed over the heads that share a kv head: deterministic, no atomics.
//
// Fused forward: where attention_fused_forward_supported (NVIDIA today), the forward is one kernel
// (kernels/flash_forward_khr.comp: FlashAttention-2 on subgroup cooperative matrices, the softmax
// in registers, no scores in memory; same roundings: q, k, v and P in fp16, statistics in fp32)
// on fp16 copies of q, k, v in their own layout. The backward needs only out and lse, so it is the
// same with or without it.
#pragma once
#include <cstdint>
#include <string>

#include "gpu/context.h"
#include "ops/gemm.h"

namespace forja::ops {

// The fused kernels' paired row tiles by default (AttentionGemmOptions' `paired`): on, unless
// FORJA_ATTENTION_PAIRED=0 (for measuring the training step with and without them in one binary).
bool attention_paired_default();
// Whether the fused forward runs its ping-pong schedule by default: FORJA_ATTENTION_PINGPONG=1.
bool attention_pingpong_default();
// dq from dS through memory by default (AttentionGemmOptions::dq_from_ds): on, unless
// FORJA_ATTENTION_DQ_FROM_DS=0 (for measuring the training step with and without it in one binary).
bool attention_dq_from_ds_default();
bool attention_dq_ds_quad_default();

struct AttentionGemmOptions {
  GemmKernel kernel = GemmKernel::automatic;  // for the products (tests pick coopmat_emulated)
  uint32_t chunk_rows = 0;                    // query rows per chunk; 0 = from scratch_budget
  // Bytes of one chunk's fp32 scores [nh, C, S]. On an H200 (Qwen3-4B, S 2048, 32 heads) 128 MiB
  // (C 512) made the training step 2% faster than 64 MiB (C 256), 256 MiB 3% for 0.56 GiB more;
  // longer chunks give the dK/dV products a deeper K (docs/benchmarks.md).
  uint64_t scratch_budget = 128ull << 20;
  // The forward as one fused kernel (kernels/flash_forward_khr.comp: FlashAttention-2 on
  // subgroup cooperative matrices, the softmax in registers) where
  // attention_fused_forward_supported says so; the backward is the same either way (it needs
  // only out and lse).
  bool fused_forward = true;
  // The fused forward's workgroups: warps subgroups of 16 query rows against tiles of keys keys
  // (subgroups 1, 2, 4 or 8; tiles 16, 32 or 64, within the device's shared memory); prefetch:
  // the next key tile's loads go out before this one's products (registers hold them), instead
  // of staging between barriers. On an H100 (S 2048, 32/8 heads x 128, `forja bench attention
  // --fused-forward-tiles`; docs/benchmarks.md) 8,64 without prefetch ran the forward in 0.344-
  // 0.349 ms at B 1 and 2.18 at B 8; 4,64 with prefetch 0.369-0.374 and 2.29.
  // paired: each workgroup computes query tiles w and n - 1 - w (the causal mask makes every pair
  // cost the same), half as many workgroups (`forja bench attention --paired`). On an H200 (run 22)
  // forward + backward at B 1 went 1.267 -> 1.161 ms, at B 8 8.428 -> 8.359; the 1x2048 step
  // +1.6%. FORJA_ATTENTION_PAIRED=0 turns it off by default, for the training step too.
  // pingpong: the kernel's PINGPONG schedule (its key_loop_pingpong: half of the subgroups run
  // their products while the other half runs its softmax; not with prefetch; the emulation runs
  // 2 subgroups for it). FORJA_ATTENTION_PINGPONG=1 turns it on by default, for the training
  // step too.
  struct FusedForwardTiles {
    uint32_t warps = 8, keys = 64;
    bool prefetch = false;
    bool paired = attention_paired_default();
    bool pingpong = attention_pingpong_default();
  } fused_forward_tiles;
  // The backward as two fused kernels (kernels/flash_backward_khr.comp: dq per query tile; dk and
  // dv together per key tile, summing a kv head's query heads; P recomputed from lse in registers)
  // where attention_fused_forward_supported says so (the same device features): on an H100 the
  // backward 0.94 ms against 1.89 for the GEMM path's (B 1, S 2048, 32/8 heads x 128, with the
  // dk/dv split below; 1.16 without it, 1.39 with separate dk and dv kernels), docs/benchmarks.md. FORJA_NO_FUSED_ATTENTION_BACKWARD=1 turns it off
  // in training.
  bool fused_backward = true;
  // Its workgroups: dq_warps subgroups of 16 query rows against tiles of dq_keys keys; kv_warps
  // subgroups of 16 keys against tiles of kv_queries queries (dk and dv). Subgroups 1, 2, 4 or
  // 8; tiles 16, 32 or 64 (within the device's shared memory: the dk/dv kernel keeps its own v
  // rows beside two tiles). The defaults are the fastest measured on an H100 (`forja bench
  // attention --fused-backward-tiles`, bwd 1.15 ms; dk/dv 2,32: 1.27; 4,16: 1.50; 2,64: 1.48).
  // paired: each workgroup of both kernels computes row tiles w and n - 1 - w (as the forward's);
  // at B 1 the backward went 0.922 -> 0.863 ms (H200, run 22).
  struct FusedBackwardTiles {
    uint32_t dq_warps = 4, dq_keys = 64, kv_warps = 4, kv_queries = 32;
    bool paired = attention_paired_default();
  } fused_backward_tiles;
  // The dk/dv kernel sums a kv head's query heads in one workgroup per key tile. Where that
  // gives fewer than dkv_split_target workgroups (one sequence of 2048 at 32/8 heads: 256),
  // several workgroups share the query heads (the smallest divisor of heads / kv-heads that
  // reaches the target, else all) and their partial dk and dv are summed after; 0: never.
  uint32_t dkv_split_target = 1024;
  // dq from dS through memory (kernels/flash_backward_khr.comp's _ds variants): the dk/dv kernel
  // writes dS (fp16, the causal half of [heads, S, S] by blocks: attention_ds_bytes) and the dq
  // kernel reads it instead of recomputing S, dP and dS, 5 products per visible pair instead of
  // 7. Where the dS of one dispatch's sequences fits a binding and 2 GiB; dq_ds_warps subgroups
  // of 16 query rows per dq workgroup, against the dk/dv kernel's key tiles. On an H100 (B 1, S
  // 2048, 32/8 heads x 128, q, k and out given in fp16 as training does) the backward took 0.813 ms
  // against 0.854 with dq recomputed; the 1x2048 step +0.6%, 0.13 GiB more (docs/benchmarks.md, run
  // 35). 4 subgroups: since dq's prefetch (1d3dbcd) faster than 8 in every sample of runs 38-41
  // (B 1 backward 0.762-0.777 ms against 0.773-0.781 in the same calls).
  bool dq_from_ds = attention_dq_from_ds_default();
  uint32_t dq_ds_warps = 4;
  // dq from dS with its subgroups 2 x 2 (kernels/flash_backward_khr.comp's QUAD): each computes 32
  // query rows by half of head_dim, so every fragment of dS or K it loads serves two products
  // (the other layout, 16 rows by all of head_dim, loads one per product). Where head_dim is a
  // multiple of 32, the dk/dv kernel's query tiles hold 32 or more and dq_ds_warps is even. On
  // an H100 the dq kernel 0.190 -> 0.180 ms, the backward 0.777 / 0.772 -> 0.759 / 0.759 (B 1),
  // 2.780 -> 2.730 (B 4), 5.315 -> 5.255 (B 8); 8 subgroups 0.771 / 0.764, 2 0.781 / 0.779
  // (docs/benchmarks.md, run 43). FORJA_ATTENTION_DQ_DS_QUAD=0 turns it off.
  bool dq_ds_quad = attention_dq_ds_quad_default();
  // q and k hold the fp16 [tokens, heads, d] copies the fused kernels read (ops::qk_norm_rope_f16
  // made them), not fp32: the fused forward and backward only, where attention_gemm_takes_f16_qk.
  bool qk_f16 = false;
  // The backward's out is fp16 in rows of out_f16_ld halves per token (heads side by side from
  // column 0; the rest of a row is the caller's), not fp32 [tokens, heads, d]: the copy of the
  // attention output that o_proj reads, which the engine keeps across checkpointing
  // (model/transformer.h). The fused backward only (it reads out for D alone); 0: fp32.
  uint32_t out_f16_ld = 0;
  // Tests: where fused_forward / fused_backward ask for the fused kernels, run their emulation
  // (kernels/flash_khr_common.glsl: no cooperative matrices, 32-lane subgroups, one per
  // workgroup but for dq from dS 2 x 2's four and the ping-pong forward's two; any device,
  // lavapipe included) with the accumulator element order {emulated_row_shift,
  // 3 - emulated_row_shift} (2: the order of NVIDIA's driver; 1: the other one the kernels know).
  bool fused_emulated = false;
  uint32_t emulated_row_shift = 2;
  // The emulation's tiles of keys (forward, dq) and of queries (dk, dv): 16, 32 or 64 within the
  // device's shared memory (lavapipe's 32 KiB hold 32 at head_dim 128, 64 up to head_dim 64), so
  // the 64-row tiles the real kernels run are covered too.
  uint32_t emulated_tile = 32;
};

// Whether attention_gemm_forward and _backward take q and k as fp16 copies (AttentionGemmOptions::
// qk_f16) for up to `batch` sequences of `seq`: both fused (o.fused_forward, o.fused_backward, and
// the device or o.fused_emulated runs them) and every sequence in one dispatch.
bool attention_gemm_takes_f16_qk(gpu::Context& ctx, uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads,
                                 uint32_t head_dim, const AttentionGemmOptions& o);

// Empty when the fused forward runs head_dim on this device, else why not: it needs KHR
// cooperative matrices 16x16x16 (fp16, fp32 accumulation) at subgroup 32, NV cooperative matrix 2's
// conversions, head_dim a multiple of 16 up to 128, FORJA_NO_COOPMAT and FORJA_NO_FUSED_ATTENTION
// unset, and the accumulator
// layout it is written for, which a probe kernel checks once per device (a one-time wait; call
// it before timing or training starts).
std::string attention_fused_forward_unsupported(gpu::Context& ctx, uint32_t head_dim);
inline bool attention_fused_forward_supported(gpu::Context& ctx, uint32_t head_dim) {
  return attention_fused_forward_unsupported(ctx, head_dim).empty();
}
// Bytes of shared memory the fused forward takes with `warps` subgroups against tiles of `keys`
// keys (kernels/flash_forward_khr.comp: the staged K and V tiles or the workgroup's q rows, two
// slots of segment ids, and where emulated its per-subgroup exchange arrays); the host refuses
// tiles beyond the device's maxComputeSharedMemorySize (49152 on NVIDIA).
uint64_t attention_fused_forward_shared_bytes(uint32_t warps, uint32_t keys, uint32_t head_dim, bool emulated);
// Whether the fused kernels run head_dim here with these options: the real ones where
// attention_fused_forward_supported, their emulation (o.fused_emulated) for head_dim a multiple
// of 16 up to 128 on any device.
bool attention_fused_kernels_run(gpu::Context& ctx, uint32_t head_dim, const AttentionGemmOptions& o);
// Whether training runs the fused backward: where the fused kernels run, unless
// FORJA_NO_FUSED_ATTENTION_BACKWARD=1.
bool attention_fused_backward_enabled(gpu::Context& ctx, uint32_t head_dim);

// drow [B, nh, S] = rowsum(dout * out) of each (token, head) row of out and dout (fp32
// [B*S, nh, d]): the fused backward's D (kernels/attention_row_dot.comp).
// out_f16_ld > 0: out is fp16 as AttentionGemmOptions::out_f16_ld says. head_dim even.
// dout16, where given: also receives dout rounded to fp16 (as to_f16_block), [B*S, nh, d], in the
// same pass (the fused backward's copy of dout).
void attention_row_dot(gpu::Context& ctx, const gpu::Buffer& out, const gpu::Buffer& dout, const gpu::Buffer& drow,
                       uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t head_dim, uint32_t out_f16_ld = 0,
                       const gpu::Buffer* dout16 = nullptr);

// Query rows per chunk for this shape (at least 1, at most seq): options.chunk_rows, else as
// many whole 16-row tiles as fit min(scratch_budget, max_binding_bytes).
uint32_t attention_gemm_chunk_rows(uint32_t seq, uint32_t n_heads, const AttentionGemmOptions& options,
                                   uint64_t max_binding_bytes);
// The same with this device's largest binding.
uint32_t attention_gemm_chunk_rows(const gpu::Context& ctx, uint32_t seq, uint32_t n_heads,
                                   const AttentionGemmOptions& options = {});

// Peak scratch bytes of attention_gemm_backward (the larger of the two) for one call.
uint64_t attention_gemm_scratch_bytes(uint32_t seq, uint32_t n_heads, uint32_t head_dim, uint32_t chunk_rows);
// The same with the fused kernels (fp16 copies of q, k, v and dout, and D, for `sequences` at once;
// qk_f16: AttentionGemmOptions::qk_f16, no copies of q and k).
// With the default options, it includes the dk/dv kernel's partial sums where it splits and
// the dS it keeps for dq (attention_ds_bytes) where that fits.
uint64_t attention_fused_scratch_bytes(uint32_t sequences, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads,
                                       uint32_t head_dim, bool qk_f16 = false);
// The dS that the fused backward keeps between its kernels where it takes dq from it
// (AttentionGemmOptions::dq_from_ds), for `sequences` in one dispatch with the dk/dv tiles `t`.
uint64_t attention_ds_bytes(uint32_t sequences, uint32_t seq, uint32_t n_heads,
                            const AttentionGemmOptions::FusedBackwardTiles& t);
// The workgroups that share each kv head's query heads in the dk/dv kernel for `sequences` in
// one dispatch (AttentionGemmOptions::dkv_split_target; 1: no split).
uint32_t attention_dkv_split(uint32_t sequences, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads,
                             const AttentionGemmOptions& o = {});

void attention_gemm_forward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                            const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                            uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                            float scale, const AttentionGemmOptions& options = {});

void attention_gemm_backward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                             const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                             const gpu::Buffer& dout, const gpu::Buffer& dq, const gpu::Buffer& dk,
                             const gpu::Buffer& dv, uint32_t batch, uint32_t seq, uint32_t n_heads,
                             uint32_t n_kv_heads, uint32_t head_dim, float scale,
                             const AttentionGemmOptions& options = {});

}  // namespace forja::ops
