#version 450
// SwiGLU with fp16 outputs in strided blocks (ops::swiglu_forward_f16, ops::swiglu_backward_f16),
// for mixed precision's projections that read these tensors only as fp16, with their LoRA factor
// folded in beside them (model/transformer.cpp):
//   swiglu_fwd_f16   h = silu(g) * u                             (g, u, h)      down_proj's input
//   swiglu_bwd_f16   dg = dh * u * silu'(g), du = dh * silu(g)   (g, u, dh, dg, du)  gate's and up's dy
// from fp32 [rows, cols] operands, rounded (round_to_f16, as to_f16_block) into fp16 [rows, ld]
// blocks, columns [0, cols) of each row (the rest of a row is the caller's: the folded LoRA factor
// goes there). silu'(z) = s + z s (1 - s), s = sigmoid(z), as elementwise.comp. One invocation per
// pair of columns, grid-stride over rows * cols / 2 (cols even).
// _checked also sets flags[pc.flag] |= 1 when a finite h is beyond fp16's range (beyond_f16):
// mixed precision's range check of the base products' inputs.
//! variant swiglu_fwd_f16 -DFORWARD
//! variant swiglu_fwd_f16_checked -DFORWARD -DRANGE_FLAG
//! variant swiglu_bwd_f16 -DBACKWARD
#ifdef RANGE_FLAG
#extension GL_KHR_memory_scope_semantics : require
#endif
#include "f16_round.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint rows, cols, ld;        // ld in halves, even
  uint g_off, u_off, dh_off;  // fp32 element offsets, even (dh_off: backward)
  uint out_off, out2_off;     // fp16 element offsets, even: h or dg, and du
  uint flag;                  // _checked: the flag this conversion sets
} pc;
layout(set = 0, binding = 0) readonly buffer G { vec2 g[]; };
layout(set = 0, binding = 1) readonly buffer U { vec2 u[]; };
#ifdef FORWARD
layout(set = 0, binding = 2) writeonly buffer H { uint h[]; };
#ifdef RANGE_FLAG
layout(set = 0, binding = 3) buffer Flags { uint flags[]; };
#endif
#else
layout(set = 0, binding = 2) readonly buffer DH { vec2 dh[]; };
layout(set = 0, binding = 3) writeonly buffer DG { uint dg[]; };
layout(set = 0, binding = 4) writeonly buffer DU { uint du[]; };
#endif

float sigmoid(float z) { return 1.0 / (1.0 + exp(-z)); }
uint pack(vec2 v) { return packHalf2x16(vec2(round_to_f16(v.x), round_to_f16(v.y))); }

void main() {
  const uint half_cols = pc.cols / 2u, pairs = pc.rows * half_cols;
  bool beyond = false;
  for (uint i = gl_GlobalInvocationID.x; i < pairs; i += gl_NumWorkGroups.x * 256u) {
    const uint r = i / half_cols, c = 2u * (i % half_cols);
    const uint at = r * pc.cols + c;  // even: cols and c are
    const vec2 gv = g[(pc.g_off + at) / 2u], uv = u[(pc.u_off + at) / 2u];
    const vec2 s = vec2(sigmoid(gv.x), sigmoid(gv.y));
    const uint to = r * pc.ld + c;
#ifdef FORWARD
    const vec2 hv = gv * s * uv;
    h[(pc.out_off + to) / 2u] = pack(hv);
    beyond = beyond || beyond_f16(hv.x) || beyond_f16(hv.y);
#else
    const vec2 dv = dh[(pc.dh_off + at) / 2u];
    dg[(pc.out_off + to) / 2u] = pack(dv * uv * (s + gv * s * (1.0 - s)));
    du[(pc.out2_off + to) / 2u] = pack(dv * gv * s);
#endif
  }
#ifdef RANGE_FLAG
  // Queue-family scope: Device scope needs vulkanMemoryModelDeviceScope where the memory model is on.
  if (beyond) atomicOr(flags[pc.flag], 1u, gl_ScopeQueueFamily, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
#endif
}
