// RoPE, half-split ("rotate_half") layout (formats.md 1.5; kernels/rope.comp), in place on fp32
// activations x [tokens, heads, head_dim]: element j < head_dim/2 pairs with j + head_dim/2,
//   x_j       <- x_j cos(a_j) - x_{j+d/2} sin(a_j)
//   x_{j+d/2} <- x_{j+d/2} cos(a_j) + x_j sin(a_j)
// with the angle a_j = float(positions[t]) * inv_freq[j] rounded to fp32 as transformers computes
// it, and cos/sin of that fp32 angle to about 1 ulp (not the GPU's built-ins, which lose
// ~1e-3 rad at large angles). positions int32 [tokens] (restarting at 0 per packed segment);
// inv_freq fp32 [head_dim/2] (model::ModelConfig computes it for each rope type).
// Tensors larger than the device's binding limit are processed in token chunks.
#pragma once
#include <cstdint>

#include "gpu/context.h"

namespace forja::ops {

void rope_forward(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& positions, const gpu::Buffer& inv_freq,
                  uint32_t tokens, uint32_t heads, uint32_t head_dim);

// The backward: dx = R^T dx, the rotation by -a_j, in place on dx [tokens, heads, head_dim].
void rope_backward(gpu::Context& ctx, const gpu::Buffer& dx, const gpu::Buffer& positions, const gpu::Buffer& inv_freq,
                   uint32_t tokens, uint32_t heads, uint32_t head_dim);

// Qwen3's per-head q/k norm, RoPE and the rounding to fp16 in one pass (kernels/qk_norm_rope.comp):
// out (fp16 [tokens, heads, head_dim], packed two per uint) = fp16(rope(rmsnorm(x, w))) and rstd
// [tokens * heads] as rmsnorm_forward gives it, from x fp32 [tokens, heads, head_dim] and w fp32
// [head_dim]: the same fp32 operations as rmsnorm_forward, rope_forward and to_f16_block in turn
// (the row's sum of squares in another order). For the fused attention kernels, which read q and
// k only as fp16 (model/transformer.cpp). head_dim a multiple of 4; token chunks within the
// binding limit.
void qk_norm_rope_f16(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, const gpu::Buffer& out,
                      const gpu::Buffer& rstd, const gpu::Buffer& positions, const gpu::Buffer& inv_freq,
                      uint32_t tokens, uint32_t heads, uint32_t head_dim, float eps);

// Its backward into the fp16 copy the projection's backward reads (kernels/qk_norm_rope.comp,
// qk_norm_rope_bwd_f16): out (fp16, rows of `out_ld` halves, a token's heads side by side from its
// column 0) = fp16(rmsnorm_backward(rope_backward(dy))), from dy fp32 [tokens, heads, head_dim]
// (the attention's dq or dk), x the norm's input and rstd its forward's, w [head_dim]: the same
// fp32 operations as rope_backward, rmsnorm_backward (weights frozen, dx written with =) and
// to_f16_block in turn (the row's dot in another order). Columns [heads * head_dim, out_ld) are
// not written. head_dim a multiple of 4, out_ld even and at least heads * head_dim.
void qk_norm_rope_backward_f16(gpu::Context& ctx, const gpu::Buffer& dy, const gpu::Buffer& x, const gpu::Buffer& w,
                               const gpu::Buffer& rstd, const gpu::Buffer& positions, const gpu::Buffer& inv_freq,
                               const gpu::Buffer& out, uint32_t out_ld, uint32_t tokens, uint32_t heads,
                               uint32_t head_dim);

}  // namespace forja::ops
