#version 450
// The second half of a split-K GEMM (ops/gemm.cpp): the slices' partial products, each already
// scaled by alpha and stored contiguously as P[s][m][n] (fp32 [slices, M, N]), are summed in
// slice order (deterministic) into C:  C[m, n] = sum_s P[s][m][n] + beta * C[m, n]. beta == 0
// never reads C (it may hold NaN), as gemm_common.glsl promises for the one-pass kernels.
//
// gemm_split_k_f16 also writes C rounded to fp16 (round to nearest even, as ops::to_f16_block)
// into one or two fp16 blocks (ops::GemmF16Copy): columns [0, N) of rows [0, M), and zeros in
// columns [N, width): the fp16 copies a folded LoRA product reads beside another operand
// (model/transformer_linear.cpp: dt beside dy and in dt16), without a dispatch of its own for each.
// N, the blocks' row strides, offsets and widths are even (two halves per uint store); an
// invocation sums a pair of adjacent columns.
//! variant gemm_split_k
//! variant gemm_split_k_f16 -DF16_COPIES
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) readonly buffer Partial { float partial[]; };
layout(set = 0, binding = 1) buffer C { float c[]; };

#ifndef F16_COPIES
layout(push_constant) uniform PC {
  uint m, n, ldc, c_offset, slices;
  float beta;
} pc;

void main() {
  const uint count = pc.m * pc.n, stride = gl_NumWorkGroups.x * 256u;
  for (uint e = gl_GlobalInvocationID.x; e < count; e += stride) {
    float acc = 0.0;
    for (uint s = 0u; s < pc.slices; ++s) acc += partial[s * count + e];
    const uint at = pc.c_offset + (e / pc.n) * pc.ldc + e % pc.n;
    c[at] = pc.beta != 0.0 ? acc + pc.beta * c[at] : acc;
  }
}
#else
#include "f16_round.glsl"
layout(push_constant) uniform PC {
  uint m, n, ldc, c_offset, slices;
  float beta;
  uint copies;                          // 1 or 2
  uint d0_offset, d0_ld, d0_width;      // halves
  uint d1_offset, d1_ld, d1_width;
} pc;
layout(set = 0, binding = 2) writeonly buffer D0 { uint d0[]; };  // two halves per uint
layout(set = 0, binding = 3) writeonly buffer D1 { uint d1[]; };

void main() {
  const uint count = pc.m * pc.n, pairs = pc.n / 2u, stride = gl_NumWorkGroups.x * 256u;
  for (uint e = gl_GlobalInvocationID.x; e < pc.m * pairs; e += stride) {
    const uint r = e / pairs, col = 2u * (e % pairs), first = r * pc.n + col;
    float acc0 = 0.0, acc1 = 0.0;
    for (uint s = 0u; s < pc.slices; ++s) {
      acc0 += partial[s * count + first];
      acc1 += partial[s * count + first + 1u];
    }
    const uint at = pc.c_offset + r * pc.ldc + col;
    if (pc.beta != 0.0) {
      acc0 += pc.beta * c[at];
      acc1 += pc.beta * c[at + 1u];
    }
    c[at] = acc0;
    c[at + 1u] = acc1;
    const uint h = packHalf2x16(vec2(round_to_f16(acc0), round_to_f16(acc1)));
    d0[(pc.d0_offset + r * pc.d0_ld + col) / 2u] = h;
    if (pc.copies > 1u) d1[(pc.d1_offset + r * pc.d1_ld + col) / 2u] = h;
  }
  // the blocks' zero columns [n, width)
  const uint z0 = (pc.d0_width - pc.n) / 2u, z1 = pc.copies > 1u ? (pc.d1_width - pc.n) / 2u : 0u;
  for (uint e = gl_GlobalInvocationID.x; e < pc.m * z0; e += stride)
    d0[(pc.d0_offset + (e / z0) * pc.d0_ld + pc.n) / 2u + e % z0] = 0u;
  for (uint e = gl_GlobalInvocationID.x; e < pc.m * z1; e += stride)
    d1[(pc.d1_offset + (e / z1) * pc.d1_ld + pc.n) / 2u + e % z1] = 0u;
}
#endif
