// The LM head fused with the causal-LM cross-entropy (formats.md 6.1), never materialising
// [T, V] logits (kernels/cross_entropy.comp + ops::gemm). Semantics as
// forja::ref::cross_entropy_forward/backward_chunked (ops/ref/cross_entropy_ref.h).
//
// Pass 1, per vocabulary chunk W_c (vocab_chunk rows of W): logits [T, Vc] = x W_c^T (gemm), then
// an online log-sum-exp merge per row across chunks, and the target's logit when it falls in the
// chunk; then lse_t and loss_sum[0] += sum_t (lse_t - logit_t[target_t]).
// Pass 2 (need_grad): recompute each chunk's logits, form dlogits = softmax - onehot(target) on
// rows with a target (0 elsewhere) and accumulate dx += inv_n dlogits W_c (gemm, alpha = inv_n,
// beta = 0 for the first chunk so dx is written, 1 after).
//
//   x         fp32 [T, H]  (final-norm output)
//   w         [V, H] fp32 or fp16 (w_dtype); with fp16, x and dlogits go through fp16 copies so
//             both GEMM operands are fp16 (fp32 accumulation)
//   targets   int32 [T], already shifted (the target of position t), -100 = ignore; any other
//             value outside [0, V) makes the loss NaN
//   loss_sum  fp32 [1]: the SUM of -log p(target) over rows with a target is ADDED (micro-batches
//             accumulate)
//   dx        fp32 [T, H], written (=) when need_grad; rows without a target get 0
//   inv_n     1 / (number of targets in the whole optimizer step)
// Scratch (freed at the end): logits [Tb, Vc] fp32 and per-row statistics, where the row block
// Tb <= T keeps every binding under maxStorageBufferRange and the logits under 32 MiB; W is
// split by ops::gemm where it exceeds the binding limit.
#pragma once
#include <cstdint>

#include "gpu/context.h"
#include "ops/gemm.h"

namespace forja::ops {

struct CrossEntropyOptions {
  uint32_t vocab_chunk = 8192;
  bool need_grad = true;
};

void lm_head_cross_entropy(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, DType w_dtype,
                           const gpu::Buffer& targets, uint32_t tokens, uint32_t hidden, uint32_t vocab, float inv_n,
                           const gpu::Buffer& loss_sum, const gpu::Buffer& dx, const CrossEntropyOptions& options = {});

// The scratch lm_head_cross_entropy holds at once for these sizes (logits block, row statistics,
// fp16 copies with fp16 weights, and the split-K partial products of its dx product), on a
// device whose largest binding is `max_binding_bytes` (UINT64_MAX: the op's own cap only): for
// the memory plan (model/memory_plan.h). Alignment rounding is not counted.
uint64_t lm_head_cross_entropy_scratch_bytes(uint32_t tokens, uint32_t hidden, uint32_t vocab, bool f16_weights,
                                             uint64_t max_binding_bytes, const CrossEntropyOptions& options = {});

}  // namespace forja::ops
