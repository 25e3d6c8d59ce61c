#include "ops/attention.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/kernel_table.h"
#include "ops/attention_common.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

// Must match PC in kernels/attention.comp.
struct AttnPush {
  uint32_t seq, n_heads, n_kv_heads, head_dim;
  float scale;
  uint32_t off[9];  // element offsets, in binding order
};
static_assert(kernels::push_block_matches<AttnPush>(kernels::attn_fwd, kernels::attn_bwd_dq, kernels::attn_bwd_dkdv),
              "AttnPush differs from kernels/attention.comp's push-constant block");

constexpr uint32_t kMaxHeadDim = 128;  // DMAX in the kernels
constexpr uint32_t kQueryTile = 16;    // BQ of attn_fwd and attn_bwd_dq
constexpr uint32_t kKeyTile = 16;      // BK of attn_bwd_dkdv

using Dims = AttentionDims;

void check_dims(const char* op, const Dims& m) {
  check_attention_heads(op, m);
  if (m.d > kMaxHeadDim)
    throw std::invalid_argument(std::string(op) + ": head_dim " + std::to_string(m.d) + " is outside 1.." +
                                std::to_string(kMaxHeadDim) + " (the kernels' tile width)");
}

}  // namespace

void attention_forward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                       const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse, uint32_t batch,
                       uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale) {
  const char* op = "attention_forward";
  const Dims m{batch, seq, n_heads, n_kv_heads, head_dim};
  check_dims(op, m);
  if (batch == 0 || seq == 0) return;
  check_attention_operands(op, m, q, k, v, segments, out, lse);

  const auto& p = ctx.pipelines().get(kernels::attn_fwd);
  const uint32_t per = sequences_per_dispatch(ctx, op, m);
  for (uint32_t b0 = 0; b0 < batch; b0 += per) {
    const uint32_t nb = std::min(per, batch - b0);
    const auto [bq, bk, bv, bs, bo, bl] = bind_attention(ctx, m, b0, nb, q, k, v, segments, out, lse);
    const AttnPush push{seq,      n_heads, n_kv_heads,
                        head_dim, scale,   {bq.offset, bk.offset, bv.offset, bs.offset, bo.offset, bl.offset, 0, 0, 0}};
    // Causal: about half of the S x S scores, each a d-long dot in QK^T and in PV.
    const double flops = 2.0 * 2.0 * nb * n_heads * (0.5 * seq * (seq + 1.0)) * head_dim;
    ctx.dispatch(p,
                 {{bq.buffer, gpu::Access::read},
                  {bk.buffer, gpu::Access::read},
                  {bv.buffer, gpu::Access::read},
                  {bs.buffer, gpu::Access::read},
                  {bo.buffer, gpu::Access::write},
                  {bl.buffer, gpu::Access::write}},
                 push, (seq + kQueryTile - 1) / kQueryTile, n_heads, nb, op, flops);
  }
}

void attention_backward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                        const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                        const gpu::Buffer& dout, const gpu::Buffer& dq, const gpu::Buffer& dk, const gpu::Buffer& dv,
                        uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                        float scale) {
  const char* op = "attention_backward";
  const Dims m{batch, seq, n_heads, n_kv_heads, head_dim};
  check_dims(op, m);
  if (batch == 0 || seq == 0) return;
  check_attention_operands(op, m, q, k, v, segments, out, lse);
  check_attention_gradients(op, m, dout, dq, dk, dv);

  // D_i = dout_i . out_i per (sequence, head, query), written by attn_bwd_dq, read by attn_bwd_dkdv.
  gpu::Buffer drow = ctx.alloc(m.stat_seq() * batch * 4, "attention D");
  const auto& pdq = ctx.pipelines().get(kernels::attn_bwd_dq);
  const auto& pkv = ctx.pipelines().get(kernels::attn_bwd_dkdv);
  const uint32_t per = sequences_per_dispatch(ctx, op, m);
  // FLOPs: dq recomputes QK^T and dP (2 products) and forms dS k; dkdv recomputes both again and
  // forms P^T dout and dS^T q: 7 causal-half products in all.
  for (uint32_t b0 = 0; b0 < batch; b0 += per) {
    const uint32_t nb = std::min(per, batch - b0);
    const AttentionBindings f = bind_attention(ctx, m, b0, nb, q, k, v, segments, out, lse);
    const AttentionGradBindings g = bind_attention_grads(ctx, m, b0, nb, dout, dq, dk, dv, drow);
    const double product = 2.0 * nb * n_heads * (0.5 * seq * (seq + 1.0)) * head_dim;

    const BackwardKernelArgs dq_args = dq_kernel_args(f, g);
    AttnPush push_dq{seq, n_heads, n_kv_heads, head_dim, scale, {}};
    std::copy(dq_args.offsets.begin(), dq_args.offsets.end(), push_dq.off);
    ctx.dispatch(pdq, dq_args.bindings, push_dq, (seq + kQueryTile - 1) / kQueryTile, n_heads, nb,
                 "attention_backward_dq", 3 * product);

    const BackwardKernelArgs kv_args = dkdv_kernel_args(f, g, g.dk, g.dv);
    AttnPush push_kv{seq, n_heads, n_kv_heads, head_dim, scale, {}};
    std::copy(kv_args.offsets.begin(), kv_args.offsets.end(), push_kv.off);
    ctx.dispatch(pkv, kv_args.bindings, push_kv, (seq + kKeyTile - 1) / kKeyTile, n_kv_heads, nb,
                 "attention_backward_dkdv", 4 * product);
  }
  ctx.free(drow);
}

}  // namespace forja::ops
