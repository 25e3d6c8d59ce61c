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

}  // namespace forja::ops
