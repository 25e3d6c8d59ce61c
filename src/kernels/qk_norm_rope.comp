#version 450
// Qwen3's per-head q/k norm and RoPE in one pass, into the fp16 copy the fused attention kernels
// read (ops::qk_norm_rope_f16, model/transformer.cpp): for each row (token, head) of x [tokens,
// heads, d] (fp32, the projection's output)
//   rstd = 1 / sqrt(mean_c(x_c^2) + eps); y_c = w_c * (x_c * rstd)          (rmsnorm.comp)
//   out_j = y_j cos(a_j) - y_{j+d/2} sin(a_j), out_{j+d/2} = y_{j+d/2} cos(a_j) + y_j sin(a_j)
//   with a_j = float(pos[token]) * inv_freq[j]                              (rope.comp)
// rounded to fp16 (round_to_f16, as to_f16_block) into out [tokens, heads, d], and rstd [rows]
// for the norm's backward. The same fp32 operations in the same order as rmsnorm_forward, then
// rope_forward, then to_f16_block, which it replaces (three passes over fp32 rows).
// LANES invocations per row (a power of two), WG / LANES rows per workgroup; each invocation
// takes column pairs (j, j+1) and their partners (j + d/2, j + d/2 + 1), j even, and the row's
// sum of squares goes through a shared-memory tree (no subgroup size assumed). d % 4 == 0.
// out's rows (tokens) are ld_out halves apart, a head's d values at head * d.
//
// qk_norm_rope_bwd_f16 (BACKWARD) is its backward into the fp16 copy the projection's backward
// reads (ops::qk_norm_rope_backward_f16): for each row, from dy (the attention's dq or dk, fp32)
//   g = rope^T(dy)   (g_j = dy_j cos(a_j) + dy_{j+d/2} sin(a_j), g_{j+d/2} = dy_{j+d/2} cos(a_j) - dy_j sin(a_j))
//   dx_c = rstd w_c g_c - x_c rstd^3 / d * sum_c(g w x)
// with x the norm's input (the projection's output) and rstd the forward's, rounded to fp16: the
// operations of rope_backward, then rmsnorm_backward, then to_f16_block (the row's dot in another
// order), which it replaces (three passes over fp32 rows and two dispatches more).
//! variant qk_norm_rope_f16
//! variant qk_norm_rope_bwd_f16 -DBACKWARD
#include "f16_round.glsl"
#include "rope_common.glsl"

layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint LANES = 16;
layout(local_size_x_id = 0) in;
const uint RPW = WG / LANES;  // rows per workgroup

layout(push_constant) uniform PC {
  uint rows;        // tokens * heads in this dispatch
  uint heads, head_dim;
  uint first_x;     // fp32 element offset of row 0 in x
  uint first_out;   // fp16 element offset of row 0 in out (even)
  uint first_r;     // element offset of row 0 in rstd
  uint first_pos;   // element offset of the dispatch's first token in pos
  float eps;
  uint ld_out;      // halves between out's rows (tokens), even
  uint first_dy;    // backward: fp32 element offset of row 0 in dy
} pc;
layout(set = 0, binding = 0) readonly buffer X { vec2 x[]; };
layout(set = 0, binding = 1) readonly buffer W { vec2 w[]; };
layout(set = 0, binding = 2) writeonly buffer O { uint o[]; };
#ifndef BACKWARD
layout(set = 0, binding = 3) writeonly buffer R { float rstd[]; };
#else
layout(set = 0, binding = 3) readonly buffer R { float rstd[]; };
#endif
layout(set = 0, binding = 4) readonly buffer P { int pos[]; };
layout(set = 0, binding = 5) readonly buffer F { float inv_freq[]; };
#ifdef BACKWARD
layout(set = 0, binding = 6) readonly buffer DY { vec2 dy[]; };
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

// sin and cos of the angles of columns j and j + 1 at position p (the fp32 angle as rope.comp's).
void angles(float p, uint j, out vec2 sn, out vec2 cs) {
  precise float angle0 = p * inv_freq[j];
  precise float angle1 = p * inv_freq[j + 1u];
  sincos_accurate(angle0, sn.x, cs.x);
  sincos_accurate(angle1, sn.y, cs.y);
}

// Columns j, j + 1 (r0) and j + d/2, j + d/2 + 1 (r1) of the fp16 row at `at`, rounded to nearest even.
void put_f16(uint at, uint j, uint hd, vec2 r0, vec2 r1) {
  o[(at + j) / 2u] = packHalf2x16(vec2(round_to_f16(r0.x), round_to_f16(r0.y)));
  o[(at + hd + j) / 2u] = packHalf2x16(vec2(round_to_f16(r1.x), round_to_f16(r1.y)));
}

#ifdef BACKWARD
// g = rope^T(dy) at columns j, j + 1 (g0) and their partners (g1) of the row at gb, with
// rope_backward's operations (x0 c - x1 (-s), x1 c + x0 (-s)). Both passes recompute it: a
// memory-bound kernel, and the pairs per invocation are not known at compile time.
void rope_grad(float p, uint j, uint gb, uint hd, out vec2 g0, out vec2 g1) {
  vec2 sn, cs;
  angles(p, j, sn, cs);
  const vec2 d0 = dy[(gb + j) / 2u], d1 = dy[(gb + hd + j) / 2u];
  g0 = d0 * cs - d1 * (-sn);
  g1 = d1 * cs + d0 * (-sn);
}

void main() {
  const uint group = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (group * RPW >= pc.rows) return;  // uniform per workgroup, so the barrier below stays uniform
  const uint t = gl_LocalInvocationIndex, lane = t % LANES;
  const uint row = group * RPW + t / LANES;
  const bool live = row < pc.rows;  // the last workgroup's rows past the end still reduce (zeros)
  const uint d = pc.head_dim, hd = d / 2u;
  const uint end = live ? hd : 0u;  // column pairs j < hd, j even
  const uint xb = pc.first_x + (live ? row : 0u) * d, gb = pc.first_dy + (live ? row : 0u) * d;  // even
  const uint token = (live ? row : 0u) / pc.heads;
  const float p = float(pos[pc.first_pos + token]);
  float dot = 0.0;  // sum(g w x)
  for (uint j = 2u * lane; j < end; j += 2u * LANES) {
    vec2 g0, g1;
    rope_grad(p, j, gb, hd, g0, g1);
    const vec2 x0 = x[(xb + j) / 2u], x1 = x[(xb + hd + j) / 2u];
    const vec2 t0 = g0 * w[j / 2u] * x0, t1 = g1 * w[(hd + j) / 2u] * x1;
    dot += t0.x + t0.y + t1.x + t1.y;
  }
  const float s = live ? rstd[pc.first_r + row] : 0.0;
  const float k = row_sum(dot) * (s * s * s) / float(d);
  if (!live) return;
  const uint at = pc.first_out + token * pc.ld_out + (row - token * pc.heads) * d;
  for (uint j = 2u * lane; j < hd; j += 2u * LANES) {
    vec2 g0, g1;
    rope_grad(p, j, gb, hd, g0, g1);
    const vec2 x0 = x[(xb + j) / 2u], x1 = x[(xb + hd + j) / 2u];
    put_f16(at, j, hd, s * w[j / 2u] * g0 - k * x0, s * w[(hd + j) / 2u] * g1 - k * x1);
  }
}
#else
void main() {
  const uint group = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (group * RPW >= pc.rows) return;  // uniform per workgroup, so the barrier below stays uniform
  const uint t = gl_LocalInvocationIndex, lane = t % LANES;
  const uint row = group * RPW + t / LANES;
  const bool live = row < pc.rows;  // the last workgroup's rows past the end still reduce (zeros)
  const uint d = pc.head_dim, hd = d / 2u;
  const uint end = live ? hd : 0u;  // column pairs j < hd, j even
  const uint base = pc.first_x + (live ? row : 0u) * d;  // even: first_x and d are
  float ss = 0.0;
  for (uint j = 2u * lane; j < end; j += 2u * LANES) {
    const vec2 a = x[(base + j) / 2u], b = x[(base + hd + j) / 2u];
    ss += a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
  }
  // rmsnorm.comp adds the squares one column at a time; this adds them in another order, which
  // moves rstd by an ulp or so at most.
  const float s = 1.0 / sqrt(row_sum(ss) / float(d) + pc.eps);
  if (!live) return;
  if (lane == 0u) rstd[pc.first_r + row] = s;
  const uint token = row / pc.heads;
  const float p = float(pos[pc.first_pos + token]);
  const uint at = pc.first_out + token * pc.ld_out + (row - token * pc.heads) * d;
  for (uint j = 2u * lane; j < hd; j += 2u * LANES) {
    const vec2 a = x[(base + j) / 2u], b = x[(base + hd + j) / 2u];
    const vec2 wa = w[j / 2u], wb = w[(hd + j) / 2u];
    const vec2 y0 = wa * (a * s), y1 = wb * (b * s);
    vec2 sn, cs;
    angles(p, j, sn, cs);
    put_f16(at, j, hd, y0 * cs - y1 * sn, y1 * cs + y0 * sn);
  }
}
#endif
