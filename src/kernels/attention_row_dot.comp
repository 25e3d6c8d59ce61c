#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require
// D = rowsum(dout * out) per (token, head), the statistic of attention's backward (dS = P (dP -
// D)), for the fused backward (flash_backward_khr.comp), which reads it per query tile.
// out and dout fp32 [tokens, heads, d]; drow fp32 [B, heads, S] like lse. 32 invocations per row,
// each summing every 32nd element, so that a subgroup's loads are contiguous (one invocation per
// row read 128 floats 512 bytes apart from its neighbours': 5x slower than memory allows on an
// H100); the 32 partial sums are added by one subgroup add where a subgroup is 32 invocations,
// one row (NVIDIA; then no barrier keeps the rows of a workgroup together), else in shared memory
// (lavapipe's subgroups of 8, AMD's of 64). It runs only beside the fused attention kernels,
// which need subgroup arithmetic too.
// attention_row_dot_f16: out is fp16 in rows of out_ld halves per token ([tokens, out_ld], heads
// side by side from column 0: the copy of the attention output that o_proj reads, which the
// engine keeps across checkpointing, model/transformer.h); out_off and out_ld even.
// _dout16: also writes dout rounded to fp16 (round to nearest even, as ops::to_f16_block) into
// dout16 [rows, head_dim] from half 0, the copy the fused kernels read, in the same pass that reads
// dout for D (one read of dout fewer than a separate conversion).
// head_dim is even: each invocation takes two adjacent elements per step.
//! variant attention_row_dot
//! variant attention_row_dot_f16 -DOUT_F16
//! variant attention_row_dot_dout16 -DDOUT16
//! variant attention_row_dot_f16_dout16 -DOUT_F16 -DDOUT16
#include "f16_round.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint rows;  // tokens * heads
  uint n_heads, head_dim, seq;
  uint out_off, dout_off, drow_off;  // element offsets in their bindings (out: halves in _f16)
  uint out_ld;                       // _f16: halves per token row of out
} pc;
#ifdef OUT_F16
layout(set = 0, binding = 0) readonly buffer Out { uint o2[]; };
#else
layout(set = 0, binding = 0) readonly buffer Out { float o[]; };
#endif
layout(set = 0, binding = 1) readonly buffer DOut { float dout[]; };
layout(set = 0, binding = 2) writeonly buffer Drow { float drow[]; };
#ifdef DOUT16
layout(set = 0, binding = 3) writeonly buffer Dout16 { uint dout16[]; };  // two halves per uint
#endif

const uint LANES = 32u, ROWS = 256u / LANES;  // per row; rows per workgroup and pass
shared float part[256];

void main() {
  const uint lane = gl_LocalInvocationIndex % LANES, slot = gl_LocalInvocationIndex / LANES;
  // The same trip count in every invocation of the workgroup (barriers below).
  for (uint r0 = gl_WorkGroupID.x * ROWS; r0 < pc.rows; r0 += gl_NumWorkGroups.x * ROWS) {
    const uint r = r0 + slot;
    float sum = 0.0;
    if (r < pc.rows) {
      const uint base = r * pc.head_dim;
#ifdef OUT_F16
      const uint out_base = pc.out_off + (r / pc.n_heads) * pc.out_ld + (r % pc.n_heads) * pc.head_dim;
#endif
      for (uint c = 2u * lane; c < pc.head_dim; c += 2u * LANES) {
#ifdef OUT_F16
        const vec2 ov = unpackHalf2x16(o2[(out_base + c) / 2u]);
#else
        const vec2 ov = vec2(o[pc.out_off + base + c], o[pc.out_off + base + c + 1u]);
#endif
        const vec2 dv = vec2(dout[pc.dout_off + base + c], dout[pc.dout_off + base + c + 1u]);
        sum += ov.x * dv.x + ov.y * dv.y;
#ifdef DOUT16
        dout16[(base + c) / 2u] = packHalf2x16(vec2(round_to_f16(dv.x), round_to_f16(dv.y)));
#endif
      }
    }
    // The same branch in every invocation of the dispatch.
    if (gl_SubgroupSize == LANES) {
      sum = subgroupAdd(sum);
    } else {
      part[gl_LocalInvocationIndex] = sum;
      barrier();
      for (uint half_ = LANES / 2u; half_ > 0u; half_ /= 2u) {
        if (lane < half_) part[gl_LocalInvocationIndex] += part[gl_LocalInvocationIndex + half_];
        barrier();
      }
      sum = part[gl_LocalInvocationIndex];
      barrier();  // the next pass overwrites part[]
    }
    if (lane == 0u && r < pc.rows) {
      const uint token = r / pc.n_heads, h = r % pc.n_heads;
      const uint b = token / pc.seq, s = token % pc.seq;
      drow[pc.drow_off + (b * pc.n_heads + h) * pc.seq + s] = sum;
    }
  }
}
