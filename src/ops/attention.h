// Causal self-attention with GQA and packed-segment masking (kernels/attention.comp), fp32,
// flash-attention style: tiles of keys with an online softmax, memory O(S) per query, never an
// [S, S] score matrix. Semantics as forja::ref::attention_forward/backward (ops/ref/attention_ref.h)
// except the lse layout, which is head-major here ([B, nh, S]) so a query tile's statistics are
// contiguous.
//
// Layout (row-major), B sequences of S tokens:
//   q, out, dq, dout  fp32 [B*S, nh, d]
//   k, v, dk, dv      fp32 [B*S, nkv, d]
//   segments          int32 [B*S]: query i sees key j iff j <= i (same sequence) and
//                     seg[j] == seg[i] != 0. Segment 0 is padding: its output row is 0, its lse is
//                     -inf, and it gets and gives no gradient.
//   lse               fp32 [B, nh, S]: log sum_j exp(scale q_i . k_j) over the visible keys, saved
//                     by the forward for the backward.
// Query head h reads kv head h / (nh / nkv); nh % nkv == 0. scale is normally 1/sqrt(d).
// Limits: 1 <= d <= 128 (the tile width of the kernels). Batches are split into several
// dispatches so that no binding exceeds the device's maxStorageBufferRange.
#pragma once
#include <cstdint>

#include "gpu/context.h"

namespace forja::ops {

void attention_forward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                       const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse, uint32_t batch,
                       uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale);

// dq, dk, dv written (=, activation gradients); dk and dv of a kv head are summed over the query
// heads that share it. As flash-attention 2: D_i = dout_i . out_i, P = exp(s - lse),
// dP = dout v^T, dS = P (dP - D); dq = scale dS k, dk = scale dS^T q, dv = P^T dout.
// Two kernels: one per query tile (dq, and D into a scratch [B, nh, S]), one per key tile (dk, dv),
// so no atomics are needed and the result is deterministic.
void attention_backward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                        const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                        const gpu::Buffer& dout, const gpu::Buffer& dq, const gpu::Buffer& dk, const gpu::Buffer& dv,
                        uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                        float scale);

}  // namespace forja::ops
