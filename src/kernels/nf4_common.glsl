// NF4 weight decoding shared by nf4.comp and the fused NF4 GEMMs (layout: src/quant/nf4.h,
// docs/formats.md section 3).
//
// The including shader declares, before including this file:
//   NF4_PACKED_BINDING  uint8 codes, two per byte, EVEN element in the HIGH nibble
//   NF4_ABSMAX_BINDING  fp32 absmax per block of 64, or (double quantisation) uint8 codes
//   NF4_NESTED_BINDING  fp32 nested absmax per 256 blocks (double quantisation only)
//   NF4_CODE8_BINDING   fp32 [256] dynamic map (double quantisation only)
// and a specialization constant NF4_DQ (1: double quantisation) plus a float `nf4_offset()`
// returning the absmax offset. Bytes are read from uint words (little-endian), so the buffers
// need no 8-bit storage feature; the arena rounds every binding up to 16 bytes, so the word
// holding the last byte is inside the binding.
//
// Element e of the weight (row-major flattened) is W[e] = NF4[q(e)] * absmax(e / 64), with
// absmax(b) = code8[absmax_q[b]] * nested[b / 256] + offset under double quantisation. Both
// products are single fp32 roundings and the sum is kept apart from the multiply (`precise`,
// no fused multiply-add), so the GPU reproduces model::nf4_dequantize bit for bit.

layout(set = 0, binding = NF4_PACKED_BINDING) readonly buffer Nf4Packed { uint nf4_packed[]; };
layout(set = 0, binding = NF4_ABSMAX_BINDING) readonly buffer Nf4AbsmaxF { float nf4_absmax_f[]; };
layout(set = 0, binding = NF4_ABSMAX_BINDING) readonly buffer Nf4AbsmaxQ { uint nf4_absmax_q[]; };
layout(set = 0, binding = NF4_NESTED_BINDING) readonly buffer Nf4Nested { float nf4_nested[]; };
layout(set = 0, binding = NF4_CODE8_BINDING) readonly buffer Nf4Code8 { float nf4_code8[]; };

const float NF4_CODE[16] = float[16](
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0);

// The decoded absmax of block b.
float nf4_block_absmax(uint b) {
  if (NF4_DQ == 0u) return nf4_absmax_f[b];
  const uint q = (nf4_absmax_q[b >> 2] >> (8u * (b & 3u))) & 0xffu;
  precise float scaled = nf4_code8[q] * nf4_nested[b >> 8];
  precise float a = scaled + nf4_offset();
  return a;
}

// The 4-bit code of element e.
uint nf4_index(uint e) {
  const uint byte_shift = 8u * ((e >> 1) & 3u);
  const uint nibble_shift = (e & 1u) == 0u ? 4u : 0u;  // even element: high nibble
  return (nf4_packed[e >> 3] >> (byte_shift + nibble_shift)) & 0xfu;
}

// W[e], dequantised.
float nf4_value(uint e) { return NF4_CODE[nf4_index(e)] * nf4_block_absmax(e >> 6); }

// The code of index i. A shader may define NF4_CODE_AT before including this file to read a
// copy of the table in shared memory: NVIDIA places the constant array in its constant bank,
// whose reads serialise when the threads of a warp ask for different entries.
#ifndef NF4_CODE_AT
#define NF4_CODE_AT(i) NF4_CODE[i]
#endif

// The 8 consecutive elements 8w .. 8w+7 (one packed word, always inside one block of 64),
// given their block's absmax. v[i] is element 8w + i.
void nf4_decode_word(uint w, float absmax, out float v[8]) {
  const uint word = nf4_packed[w];
  [[unroll]] for (uint j = 0; j < 4u; ++j) {
    const uint byte = (word >> (8u * j)) & 0xffu;
    v[2u * j] = NF4_CODE_AT(byte >> 4) * absmax;
    v[2u * j + 1u] = NF4_CODE_AT(byte & 0xfu) * absmax;
  }
}
