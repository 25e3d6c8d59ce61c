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
// the LoRA factor the product takes with it (ops::nf4_dequantize). That factor can come in the
// same dispatch (ops::Nf4Beside, fp16 strided only): after the weight's words, invocations write
// a block of ext_rows x ext_width halves at ext_at (row stride ld), fp16(scale * src[r][c -
// ext_lead]) for r < ext_valid_rows, ext_lead <= c < ext_lead + ext_cols, 0 elsewhere: what
// ops::to_f16_block would write, one dispatch fewer per product.
//! variant nf4
//! variant nf4_f16 -DOUT_F16
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint NF4_DQ = 0;
// nf4_f16: packed words per invocation.
layout(constant_id = 1) const uint WORDS = 4;

layout(push_constant) uniform Nf4Push {
  uint first;   // first element of this dispatch (multiple of 8)
  uint count;   // elements to write
  uint groups_x;
  float absmax_offset;
  uint cols, ld;  // W's row length and the output's row stride (elements; equal: contiguous)
  uint ext_rows, ext_width, ext_at;  // the block beside W (halves; ext_rows 0: none)
  uint ext_src_off, ext_src_ld, ext_valid_rows, ext_cols;
  float ext_scale;
  uint ext_lead;  // the block's column of its source's first column
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
layout(set = 0, binding = 5) readonly buffer Ext { float ext_src[]; };  // fp32 source of the block beside W
#else
layout(set = 0, binding = 4) writeonly buffer Out { float dst[]; };
#endif

#ifdef OUT_F16
// 8 values rounded to fp16 (round to nearest even first, so packHalf2x16 converts exactly
// whatever its rounding mode), as one 16-byte store.
uvec4 to_f16x8(const float v[8]) {
  uint u[4];
  [[unroll]] for (uint i = 0; i < 4u; ++i)
    u[i] = packHalf2x16(vec2(round_to_f16(v[2u * i]), round_to_f16(v[2u * i + 1u])));
  return uvec4(u[0], u[1], u[2], u[3]);
}

// Output element of dispatch element `local` (W[e0]): strided rows are bound from 0.
uint out_at(uint local, uint e0) { return pc.ld == pc.cols ? local : (e0 / pc.cols) * pc.ld + e0 % pc.cols; }

// Word w of this dispatch (8 elements from pc.first + 8 w) decoded, rounded and stored.
void dequantize_word(uint w) {
  const uint local = w * 8u, e0 = pc.first + local;
  float v[8];
  nf4_decode_word(e0 >> 3, nf4_block_absmax(e0 >> 6), v);
  dst[out_at(local, e0) >> 3] = to_f16x8(v);
}

// Chunk x (8 halves) of the block beside W.
void beside_chunk(uint x) {
  const uint per_row = pc.ext_width / 8u;
  if (x >= pc.ext_rows * per_row) return;
  const uint r = x / per_row, c0 = (x % per_row) * 8u;
  float e[8];
  [[unroll]] for (uint i = 0; i < 8u; ++i) {
    const uint c = c0 + i - pc.ext_lead;  // the source's column (wraps past every column before lead)
    e[i] = r < pc.ext_valid_rows && c < pc.ext_cols ? pc.ext_scale * ext_src[pc.ext_src_off + r * pc.ext_src_ld + c] : 0.0;
  }
  dst[(pc.ext_at + r * pc.ld + c0) >> 3] = to_f16x8(e);
}
#endif

void main() {
  if (gl_LocalInvocationIndex < 16u) nf4_lut[gl_LocalInvocationIndex] = NF4_CODE[gl_LocalInvocationIndex];
  barrier();
#ifdef OUT_F16
  // WORDS words per invocation, each pass a workgroup-wide contiguous run (loads and stores stay
  // coalesced, and each invocation has several loads in flight); the workgroups after the
  // weight's write the block beside it, one chunk per invocation.
  const uint wg = gl_WorkGroupID.y * pc.groups_x + gl_WorkGroupID.x;
  const uint words = pc.count / 8u, weight_groups = (words + 256u * WORDS - 1u) / (256u * WORDS);
  if (wg < weight_groups) {
    [[unroll]] for (uint j = 0; j < WORDS; ++j) {
      const uint w = wg * 256u * WORDS + j * 256u + gl_LocalInvocationIndex;
      if (w < words) dequantize_word(w);
    }
  } else {
    beside_chunk((wg - weight_groups) * 256u + gl_LocalInvocationIndex);
  }
#else
  const uint t = gl_WorkGroupID.y * pc.groups_x * 256u + gl_WorkGroupID.x * 256u + gl_LocalInvocationIndex;
  const uint local = t * 8u;  // element offset inside this dispatch
  if (local >= pc.count) return;
  float v[8];
  nf4_decode_word((pc.first + local) >> 3, nf4_block_absmax((pc.first + local) >> 6), v);
  [[unroll]] for (uint i = 0; i < 8u; ++i)
    if (local + i < pc.count) dst[local + i] = v[i];
#endif
}
