#version 450
// Elementwise fp32 ops over n elements, one variant each. Every invocation walks the array with
// a grid stride, so any n works with a bounded workgroup count.
//   add          y = a + b                          (a, b, y)
//   scale        y = alpha * x                      (x, y)
//   silu         y = x * sigmoid(x)                 (x, y)
//   silu_bwd     dx = dy * silu'(x)                 (x, dy, dx)
//   swiglu       h = silu(g) * u                    (g, u, h)
//   swiglu_bwd   dg = dh * u * silu'(g), du = dh * silu(g)   (g, u, dh, dg, du)
//   to_f16       y = fp16(x), round to nearest even, packed two per uint; n odd pads a 0  (x, y)
//   to_f16_checked  to_f16, and flags[pc.flag] |= 1 when a finite x is beyond fp16's range
//                (|x| >= 65520 rounds to infinity): mixed precision's range check   (x, y, flags)
// with silu'(z) = s + z s (1 - s), s = sigmoid(z). Outputs may alias inputs elementwise.
//! variant ew_add -DOP_ADD
//! variant ew_scale -DOP_SCALE
//! variant ew_silu -DOP_SILU
//! variant ew_silu_bwd -DOP_SILU_BWD
//! variant ew_swiglu -DOP_SWIGLU
//! variant ew_swiglu_bwd -DOP_SWIGLU_BWD
//! variant ew_to_f16 -DOP_TO_F16
//! variant ew_to_f16_checked -DOP_TO_F16 -DRANGE_FLAG
#ifdef RANGE_FLAG
#extension GL_KHR_memory_scope_semantics : require
#endif
#include "f16_round.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC { uint n; float alpha; uint flag; } pc;

layout(set = 0, binding = 0) buffer B0 { float b0[]; };
#ifdef OP_TO_F16
layout(set = 0, binding = 1) writeonly buffer B1 { uint b1[]; };
#ifdef RANGE_FLAG
layout(set = 0, binding = 2) buffer Flags { uint flags[]; };
#endif
#else
layout(set = 0, binding = 1) buffer B1 { float b1[]; };
#endif
#if defined(OP_ADD) || defined(OP_SILU_BWD) || defined(OP_SWIGLU) || defined(OP_SWIGLU_BWD)
layout(set = 0, binding = 2) buffer B2 { float b2[]; };
#endif
#ifdef OP_SWIGLU_BWD
layout(set = 0, binding = 3) buffer B3 { float b3[]; };
layout(set = 0, binding = 4) buffer B4 { float b4[]; };
#endif

float sigmoid(float z) { return 1.0 / (1.0 + exp(-z)); }

void main() {
  const uint stride = gl_NumWorkGroups.x * 256u;
#ifdef OP_TO_F16
  bool beyond = false;
  for (uint i = gl_GlobalInvocationID.x; 2u * i < pc.n; i += stride) {
    const float lo = b0[2u * i], hi = 2u * i + 1u < pc.n ? b0[2u * i + 1u] : 0.0;
    b1[i] = packHalf2x16(vec2(round_to_f16(lo), round_to_f16(hi)));
    beyond = beyond || beyond_f16(lo) || beyond_f16(hi);
  }
#ifdef RANGE_FLAG
  // Queue-family scope: Device scope needs vulkanMemoryModelDeviceScope where the memory model is on.
  if (beyond) atomicOr(flags[pc.flag], 1u, gl_ScopeQueueFamily, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
#endif
  return;
#endif
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
#if defined(OP_ADD)
    b2[i] = b0[i] + b1[i];
#elif defined(OP_SCALE)
    b1[i] = pc.alpha * b0[i];
#elif defined(OP_SILU)
    float x = b0[i];
    b1[i] = x * sigmoid(x);
#elif defined(OP_SILU_BWD)
    float x = b0[i], s = sigmoid(x);
    b2[i] = b1[i] * (s + x * s * (1.0 - s));
#elif defined(OP_SWIGLU)
    float g = b0[i];
    b2[i] = g * sigmoid(g) * b1[i];
#elif defined(OP_SWIGLU_BWD)
    float g = b0[i], u = b1[i], dh = b2[i], s = sigmoid(g);
    b3[i] = dh * u * (s + g * s * (1.0 - s));
    b4[i] = dh * g * s;
#endif
  }
}
