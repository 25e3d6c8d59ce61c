#version 450
// SwiGLU's backward with fp16 outputs (ops::swiglu_backward_f16), for mixed precision's gate and
// up projections, whose backward reads dy only as fp16: dg = dh * u * silu'(g), du = dh *
// silu(g) from fp32 g, u, dh [rows, cols], rounded (round_to_f16, as to_f16_block) into fp16
// [rows, ld] blocks, columns [0, cols) of each row (the rest of a row is the caller's: the folded
// LoRA factor dt goes there). One invocation per pair of columns, grid-stride over rows * cols / 2
// (cols even). silu'(z) = s + z s (1 - s), s = sigmoid(z), as elementwise.comp's swiglu_bwd.
#include "f16_round.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint rows, cols, ld;              // ld in halves, even
  uint g_off, u_off, dh_off;        // fp32 element offsets, even
  uint dg_off, du_off;              // fp16 element offsets, even
} pc;
layout(set = 0, binding = 0) readonly buffer G { vec2 g[]; };
layout(set = 0, binding = 1) readonly buffer U { vec2 u[]; };
layout(set = 0, binding = 2) readonly buffer DH { vec2 dh[]; };
layout(set = 0, binding = 3) writeonly buffer DG { uint dg[]; };
layout(set = 0, binding = 4) writeonly buffer DU { uint du[]; };

float sigmoid(float z) { return 1.0 / (1.0 + exp(-z)); }

void main() {
  const uint half_cols = pc.cols / 2u, pairs = pc.rows * half_cols;
  for (uint i = gl_GlobalInvocationID.x; i < pairs; i += gl_NumWorkGroups.x * 256u) {
    const uint r = i / half_cols, c = 2u * (i % half_cols);
    const uint at = r * pc.cols + c;  // even: cols and c are
    const vec2 gv = g[(pc.g_off + at) / 2u], uv = u[(pc.u_off + at) / 2u], dv = dh[(pc.dh_off + at) / 2u];
    const vec2 s = vec2(sigmoid(gv.x), sigmoid(gv.y));
    const vec2 dgv = dv * uv * (s + gv * s * (1.0 - s));
    const vec2 duv = dv * gv * s;
    dg[(pc.dg_off + r * pc.ld + c) / 2u] = packHalf2x16(vec2(round_to_f16(dgv.x), round_to_f16(dgv.y)));
    du[(pc.du_off + r * pc.ld + c) / 2u] = packHalf2x16(vec2(round_to_f16(duv.x), round_to_f16(duv.y)));
  }
}
