#version 450
// RMSNorm over the last axis of x [rows, cols] (formats.md 1.4), fp32 activations, weight w
// [cols] in fp32 or fp16. Each row is handled by LANES invocations of a workgroup of WG, so a
// workgroup does WG / LANES rows (group = gl_WorkGroupID.x + gl_WorkGroupID.y *
// gl_NumWorkGroups.x, so more than 65535 groups fit one dispatch); a row's invocations stride over
// its columns and reduce through a shared-memory tree (no subgroup size assumed).
//   rmsnorm_fwd_*:  rstd[r] = 1 / sqrt(mean_c(x[r,c]^2) + eps); y[r,c] = w[c] * (x[r,c] * rstd[r])
//                                                                 (x, w, y, rstd)
//   rmsnorm_bwd_*:  dx[r,c] (= or +=) rstd w[c] dy[r,c] - x[r,c] rstd^3 / cols * sum_c(dy w x)
//                                                                 (dy, x, w, rstd, dx)
// The weights are frozen, so there is no dw. Outputs may alias inputs of the same shape (y = x,
// dx = dy without accumulate): every invocation reads an element before it writes that element
// and writes only after the row's reduction barrier.
// Specialization constants 0 (WG, the workgroup size) and 1 (LANES), powers of two with LANES <=
// WG <= 256: the op gives short rows (Qwen3's per-head q/k norms, cols = head_dim) 32 lanes and
// 8 rows per workgroup (one workgroup per 128-column row ran at about half the memory's speed).
// `first_*` are element offsets inside the bindings: the op binds chunks of large tensors at
// aligned offsets and passes the remainder here.
//   rmsnorm_fwd_out16*: the forward with y rounded to fp16 (round_to_f16, as to_f16_block) into
//                columns [0, cols) of an fp16 [rows, ld_y] block (cols even), for mixed precision's
//                projections that read their input only as fp16 (model/transformer.cpp);
//                _checked also sets flags[pc.flag] |= 1 when a finite y is beyond fp16's range
//                                                                 (x, w, y16, rstd[, flags])
//! variant rmsnorm_fwd_f32 -DFORWARD
//! variant rmsnorm_fwd_f16 -DFORWARD -DW_F16
//! variant rmsnorm_fwd_out16 -DFORWARD -DOUT16
//! variant rmsnorm_fwd_out16_checked -DFORWARD -DOUT16 -DRANGE_FLAG
//! variant rmsnorm_bwd_f32 -DBACKWARD
//! variant rmsnorm_bwd_f16 -DBACKWARD -DW_F16
#ifdef RANGE_FLAG
#extension GL_KHR_memory_scope_semantics : require
#endif
#ifdef OUT16
#include "f16_round.glsl"
#endif
#ifdef W_F16
#extension GL_EXT_shader_16bit_storage : require
#define WTYPE float16_t
#else
#define WTYPE float
#endif

layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint LANES = 256;
layout(local_size_x_id = 0) in;
const uint RPW = WG / LANES;  // rows per workgroup
layout(push_constant) uniform PC {
  uint rows;      // rows in this dispatch
  uint cols;
  uint first_x;   // element offset of row 0 in x / y / dy / dx (all [rows, cols])
  uint first_r;   // element offset of row 0 in rstd
  float eps;
  uint accumulate;  // backward: 1 = dx += result
  uint first_y;     // out16: fp16 element offset of row 0 in y16 (even)
  uint ld_y;        // out16: y16's row stride in halves (even)
  uint flag;        // out16_checked: the flag this conversion sets
} pc;

#ifdef FORWARD
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer W { WTYPE w[]; };
#ifdef OUT16
layout(set = 0, binding = 2) writeonly buffer Y16 { uint y16[]; };
#else
layout(set = 0, binding = 2) buffer Y { float y[]; };
#endif
layout(set = 0, binding = 3) writeonly buffer R { float rstd[]; };
#ifdef RANGE_FLAG
layout(set = 0, binding = 4) buffer Flags { uint flags[]; };
#endif
#else
layout(set = 0, binding = 0) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { WTYPE w[]; };
layout(set = 0, binding = 3) readonly buffer R { float rstd[]; };
layout(set = 0, binding = 4) buffer DX { float dx[]; };
#endif

shared float red[WG];

// Sum of v over the LANES invocations of this invocation's row; each of them gets the result.
float row_sum(float v) {
  const uint t = gl_LocalInvocationIndex, lane = t % LANES;
  red[t] = v;
  barrier();
  for (uint s = LANES / 2u; s > 0u; s >>= 1) {
    if (lane < s) red[t] += red[t + s];
    barrier();
  }
  return red[t - lane];
}

void main() {
  const uint group = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (group * RPW >= pc.rows) return;  // uniform per workgroup, so the barriers below stay uniform
  const uint t = gl_LocalInvocationIndex, lane = t % LANES;
  const uint row = group * RPW + t / LANES;
  const bool live = row < pc.rows;  // the last workgroup's rows past the end still reduce (zeros)
  const uint base = pc.first_x + (live ? row : 0u) * pc.cols;
  const uint end = live ? pc.cols : 0u;
#ifdef FORWARD
  float ss = 0.0;
  for (uint c = lane; c < end; c += LANES) ss += x[base + c] * x[base + c];
  const float s = 1.0 / sqrt(row_sum(ss) / float(pc.cols) + pc.eps);
#ifdef OUT16
  bool beyond = false;
  const uint at = pc.first_y + (live ? row : 0u) * pc.ld_y;
  for (uint c = 2u * lane; c < end; c += 2u * LANES) {
    const float y0 = float(w[c]) * (x[base + c] * s), y1 = float(w[c + 1u]) * (x[base + c + 1u] * s);
    y16[(at + c) / 2u] = packHalf2x16(vec2(round_to_f16(y0), round_to_f16(y1)));
    beyond = beyond || beyond_f16(y0) || beyond_f16(y1);
  }
#ifdef RANGE_FLAG
  // Queue-family scope: Device scope needs vulkanMemoryModelDeviceScope where the memory model is on.
  if (beyond) atomicOr(flags[pc.flag], 1u, gl_ScopeQueueFamily, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
#endif
#else
  for (uint c = lane; c < end; c += LANES) y[base + c] = float(w[c]) * (x[base + c] * s);
#endif
  if (lane == 0u && live) rstd[pc.first_r + row] = s;
#else
  float dot = 0.0;  // sum_c dy * w * x
  for (uint c = lane; c < end; c += LANES) dot += dy[base + c] * float(w[c]) * x[base + c];
  const float s = live ? rstd[pc.first_r + row] : 0.0;
  const float k = row_sum(dot) * (s * s * s) / float(pc.cols);
  for (uint c = lane; c < end; c += LANES) {
    const float g = s * float(w[c]) * dy[base + c] - k * x[base + c];
    dx[base + c] = pc.accumulate != 0u ? dx[base + c] + g : g;
  }
#endif
}
