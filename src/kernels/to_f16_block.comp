#version 450
// A block of an fp32 matrix rounded into a block of an fp16 one (ops::to_f16_block), for the
// products that take several operands side by side: mixed precision's base products with the
// LoRA factors folded in (model/transformer_linear.cpp: x16 | t16 against W | s B, dy16 | dt16 against
// W ; A). dst[r][c] = fp16(scale * src[r][c - lead]) for lead <= c < lead + cols, 0 elsewhere in
// [0, width) (a factor placed among others' columns, padding up to whole K tiles), r < rows; both
// row-major with their own row strides, from element offsets.
// Rounding is round to nearest even (round_to_f16) as in to_f16. A workgroup covers 256 / lanes
// rows, `lanes` invocations to a row (a power of two: 256 for rows wider than 256 chunks, fewer
// for narrow blocks such as the LoRA factors' [T, 64], which would otherwise leave most of a
// 256-wide workgroup idle in each of T workgroups); one invocation per VEC halves along the row,
// grid-stride over it. VEC (specialization constant 0) is 2, or 4 where the host found every
// source row start, destination row start, lead, cols and width multiples of 4 (one vec4 load, one
// uvec2 store).
// _checked also sets flags[pc.flag] |= 1 when a finite source value is beyond fp16's range
// (beyond_f16): mixed precision's range check of the base products' inputs.
//! variant to_f16_block
//! variant to_f16_block_checked -DRANGE_FLAG
#ifdef RANGE_FLAG
#extension GL_KHR_memory_scope_semantics : require
#endif
#include "f16_round.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint rows, cols, width;  // block shape: rows x width written, cols columns from src
  uint src_ld, src_off;    // in fp32 elements
  uint dst_ld, dst_off;    // in fp16 elements
  float scale;
  uint flag;               // _checked: the flag this conversion sets
  uint lanes;              // invocations per row: a power of two up to 256
  uint lead;               // the block's column of src's first column
} pc;

layout(constant_id = 0) const uint VEC = 2;

layout(set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(set = 0, binding = 0) readonly buffer Src4 { vec4 src4[]; };  // the same binding, VEC 4
layout(set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };    // two halves per uint
layout(set = 0, binding = 1) writeonly buffer Dst2 { uvec2 dst2[]; }; // four halves, VEC 4
#ifdef RANGE_FLAG
layout(set = 0, binding = 2) buffer Flags { uint flags[]; };
#endif

void main() {
  const uint lane = gl_LocalInvocationID.x & (pc.lanes - 1u);
  const uint r = gl_WorkGroupID.y * (256u / pc.lanes) + gl_LocalInvocationID.x / pc.lanes;
  if (r >= pc.rows) return;  // the last workgroup's spare rows (no barriers below)
  // src's column c - lead, from element s + c (s may sit before src_off: only c >= lead reads)
  const uint s = pc.src_off + r * pc.src_ld - pc.lead, d = pc.dst_off + r * pc.dst_ld;  // elements, halves
  const uint c_end = pc.lead + pc.cols;
  bool beyond = false;
  for (uint c = VEC * (gl_WorkGroupID.x * pc.lanes + lane); c < pc.width; c += VEC * gl_NumWorkGroups.x * pc.lanes) {
    if (VEC == 4u) {
      // lead and cols are multiples of 4: a chunk is all source or all padding
      const vec4 v = c >= pc.lead && c < c_end ? pc.scale * src4[(s + c) / 4u] : vec4(0.0);
      dst2[(d + c) / 4u] = uvec2(packHalf2x16(vec2(round_to_f16(v.x), round_to_f16(v.y))),
                                 packHalf2x16(vec2(round_to_f16(v.z), round_to_f16(v.w))));
      beyond = beyond || beyond_f16(v.x) || beyond_f16(v.y) || beyond_f16(v.z) || beyond_f16(v.w);
    } else {
      const float lo = c >= pc.lead && c < c_end ? pc.scale * src[s + c] : 0.0;
      const float hi = c + 1u >= pc.lead && c + 1u < c_end ? pc.scale * src[s + c + 1u] : 0.0;
      dst[(d + c) / 2u] = packHalf2x16(vec2(round_to_f16(lo), round_to_f16(hi)));
      beyond = beyond || beyond_f16(lo) || beyond_f16(hi);
    }
  }
#ifdef RANGE_FLAG
  // Queue-family scope: Device scope needs vulkanMemoryModelDeviceScope where the memory model is on.
  if (beyond) atomicOr(flags[pc.flag], 1u, gl_ScopeQueueFamily, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed);
#endif
}
