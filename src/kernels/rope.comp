#version 450
// RoPE, half-split ("rotate_half") layout (formats.md 1.5), in place on x [tokens, heads, head_dim]
// (fp32): element j < head_dim/2 pairs with element j + head_dim/2,
//   x_j       <- x_j cos(a) - x_{j+d/2} sin(a)
//   x_{j+d/2} <- x_{j+d/2} cos(a) + x_j sin(a),       a = sign * float(pos[t]) * inv_freq[j]
// sign = +1 is the forward; sign = -1 the backward (the transpose of a rotation is the rotation
// by -a).                                                             (x, pos, inv_freq)
//
// One invocation per (token, j), grid-stride; it computes cos/sin once and rotates that pair in
// every head. Neighbouring invocations take neighbouring j, so loads and stores are contiguous.
//
// Why not the built-in sin/cos: the angle reaches tens of thousands of radians (position times
// inv_freq[0] = 1), and Vulkan only promises the built-ins to 2^-11 absolute error inside
// [-pi, pi]; a range reduction in plain fp32 loses about ulp(a) (2e-3 rad at a = 16k). The
// reference (like transformers) takes cos/sin of the fp32 angle exactly, so this kernel reduces
// the angle by k pi/2 itself, with pi/2 in three fp32 parts and the leading product k * P1
// formed exactly (Dekker's product from 12-bit halves: Vulkan's fma need not be fused, and
// lavapipe's is not), then evaluates minimax polynomials on [-pi/4, pi/4] (Cephes sinf/cosf).
// The result is within about 1.2e-7 of the exact cos/sin for |a| < 2^20 (positions up to a
// million with inv_freq[0] = 1), degrading slowly beyond.
//! variant rope
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint tokens;     // tokens in this dispatch
  uint heads;
  uint half_dim;   // head_dim / 2
  uint first_x;    // element offset of the first token's row in the x binding
  uint first_pos;  // element offset of the first token in the positions binding
  float sign;      // +1 forward, -1 backward
} pc;
layout(set = 0, binding = 0) buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer P { int pos[]; };
layout(set = 0, binding = 2) readonly buffer F { float inv_freq[]; };

#include "rope_common.glsl"

void main() {
  const uint pairs = pc.tokens * pc.half_dim;
  const uint head_dim = 2u * pc.half_dim;
  for (uint i = gl_GlobalInvocationID.x; i < pairs; i += gl_NumWorkGroups.x * 256u) {
    const uint t = i / pc.half_dim, j = i % pc.half_dim;
    // The angle rounded to fp32 as transformers computes it (formats.md 1.5): one multiply.
    precise float angle = float(pos[pc.first_pos + t]) * inv_freq[j];
    float s, c;
    sincos_accurate(angle, s, c);
    s *= pc.sign;
    uint base = pc.first_x + t * pc.heads * head_dim + j;
    for (uint h = 0u; h < pc.heads; ++h, base += head_dim) {
      const float x0 = x[base], x1 = x[base + pc.half_dim];
      x[base] = x0 * c - x1 * s;
      x[base + pc.half_dim] = x1 * c + x0 * s;
    }
  }
}
