#version 450
// NF4 dequantisation of a whole weight to fp32 (tests, merges): out[e - first] = W[e] for the
// elements e in [first, first + count) of this dispatch (ops/nf4.cpp splits outputs larger than
// the binding limit; `first` is a multiple of 8).
//
// One invocation per packed word: 8 consecutive elements in one block of 64, decoded with one
// absmax lookup. The 2D grid (x * 65535 groups) reaches tensors beyond 65535 * 2048 elements.
//
// nf4_f16 writes fp16 instead (round to nearest even), for mixed precision: the layer's weight is
// dequantised once into a scratch buffer that the dense cooperative-matrix GEMM then reads, which
// runs several times faster than decoding inside the product's inner loop. count is a multiple
// of 8 there (the host checks), so every invocation writes whole words. The codebook is read from
// a shared-memory copy (see NF4_CODE_AT in nf4_common.glsl). With ld > cols (fp16 only, one
// dispatch) row r of W goes to dst elements [r * ld, r * ld + cols): room beside each row for
// the LoRA factor the product takes with it (ops::nf4_dequantize).
//! variant nf4
//! variant nf4_f16 -DOUT_F16
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint NF4_DQ = 0;

layout(push_constant) uniform Nf4Push {
  uint first;   // first element of this dispatch (multiple of 8)
  uint count;   // elements to write
  uint groups_x;
  float absmax_offset;
  uint cols, ld;  // W's row length and the output's row stride (elements; equal: contiguous)
} pc;
float nf4_offset() { return pc.absmax_offset; }

#define NF4_PACKED_BINDING 0
#define NF4_ABSMAX_BINDING 1
#define NF4_NESTED_BINDING 2
#define NF4_CODE8_BINDING 3
shared float nf4_lut[16];
#define NF4_CODE_AT(i) nf4_lut[i]
#include "nf4_common.glsl"

#ifdef OUT_F16
#include "f16_round.glsl"
layout(set = 0, binding = 4) writeonly buffer Out { uvec4 dst[]; };  // 8 halves per element
#else
layout(set = 0, binding = 4) writeonly buffer Out { float dst[]; };
#endif

void main() {
  if (gl_LocalInvocationIndex < 16u) nf4_lut[gl_LocalInvocationIndex] = NF4_CODE[gl_LocalInvocationIndex];
  barrier();
  const uint t = gl_WorkGroupID.y * pc.groups_x * 256u + gl_WorkGroupID.x * 256u + gl_LocalInvocationIndex;
  const uint local = t * 8u;  // element offset inside this dispatch
  if (local >= pc.count) return;
  const uint e0 = pc.first + local;
  float v[8];
  nf4_decode_word(e0 >> 3, nf4_block_absmax(e0 >> 6), v);
#ifdef OUT_F16
  uint u[4];
  // rounded first (integer RNE), so packHalf2x16 converts exactly whatever its rounding mode
  [[unroll]] for (uint i = 0; i < 4u; ++i)
    u[i] = packHalf2x16(vec2(round_to_f16(v[2u * i]), round_to_f16(v[2u * i + 1u])));
  const uint o = pc.ld == pc.cols ? local : (e0 / pc.cols) * pc.ld + e0 % pc.cols;  // strided: bound from 0
  dst[o >> 3] = uvec4(u[0], u[1], u[2], u[3]);
#else
  [[unroll]] for (uint i = 0; i < 8u; ++i)
    if (local + i < pc.count) dst[local + i] = v[i];
#endif
}
