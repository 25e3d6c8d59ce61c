#version 450
// Fused NF4 GEMM, scalar tiled (no matrix cores), fp32 arithmetic:
//   TB = 1 (forward):        C [M, N] = alpha * A [M, K] * W^T + beta * C,  W [N, K] NF4
//   TB = 0 (input gradient): C [M, N] = alpha * A [M, K] * W   + beta * C,  W [K, N] NF4
// A and C are fp32 row-major views (leading dimension and element offset in the push constants).
// The weight W (rows x cols, row-major, see nf4_common.glsl) is never dequantised as a whole:
// each 4-element chunk of a tile of op(W) is decoded (nibbles, absmax) while it is loaded and
// staged in shared memory as fp32, exactly as gemm.comp stages its B operand. Tiling and main
// loop: gemm_scalar_core.glsl. Loads outside the matrices read as zero, stores outside C are
// skipped, so any M, N, K works.
//
// VECA: A's chunks are single vec4 loads (lda, the offset and K multiples of 4). VECB: W's
// stored rows (cols elements) are a multiple of 4 long, so a chunk is 4 nibbles of one packed
// word inside one block of 64, decoded with one absmax. VECC: C read and written as vec4s.
//
// The nf4_gemm_f16 variants (ROUND_F16) round A and the decoded W to fp16 on load (fp32
// accumulation), the arithmetic of nf4_gemm_coopmat.comp: mixed precision on devices without
// cooperative matrices.
//! variant nf4_gemm_t64 -DBM=64 -DBN=64 -DBK=16 -DQM=1 -DQN=1
//! variant nf4_gemm_t128 -DBM=128 -DBN=128 -DBK=8 -DQM=2 -DQN=2
//! variant nf4_gemm_f16_t64 -DROUND_F16 -DBM=64 -DBN=64 -DBK=16 -DQM=1 -DQN=1
//! variant nf4_gemm_f16_t128 -DROUND_F16 -DBM=128 -DBN=128 -DBK=8 -DQM=2 -DQN=2
#extension GL_EXT_control_flow_attributes : require
#ifdef ROUND_F16
#include "f16_round.glsl"
#define OPERAND4(v) round_to_f16(v)
#else
#define OPERAND4(v) (v)
#endif

layout(local_size_x = (BM / (4 * QM)) * (BN / (4 * QN))) in;
const uint TA = 0;
layout(constant_id = 0) const uint TB = 1;
layout(constant_id = 1) const uint NF4_DQ = 0;
layout(constant_id = 2) const uint VECA = 0;
layout(constant_id = 3) const uint VECB = 0;
layout(constant_id = 4) const uint VECC = 0;

layout(push_constant) uniform Nf4GemmPush {
  uint M, N, K;
  uint lda, ldc;
  uint a_offset, c_offset;  // elements from the start of the A and C bindings
  float alpha, beta;        // beta == 0 never reads C (it may hold NaN)
  float absmax_offset;
} pc;
float nf4_offset() { return pc.absmax_offset; }

layout(set = 0, binding = 0) readonly buffer BufA4 { vec4 A4[]; };
layout(set = 0, binding = 0) readonly buffer BufA1 { float A1[]; };
#define NF4_PACKED_BINDING 1
#define NF4_ABSMAX_BINDING 2
#define NF4_NESTED_BINDING 3
#define NF4_CODE8_BINDING 4
#include "nf4_common.glsl"
layout(set = 0, binding = 5) buffer BufC4 { vec4 C4[]; };
layout(set = 0, binding = 5) buffer BufC1 { float C1[]; };

// The NF4 code table, copied to shared memory once per workgroup: indexing the constant array
// with a variable makes a function-local copy of it at every use (glslc -O), which a driver
// may well keep in local memory.
shared float code_sh[16];

// Elements k..k+3 of row m of A, zero outside A (ROUND_F16: rounded to fp16). (No early returns in these helpers: see
// gemm_scalar_core.glsl.)
vec4 chunk_a(uint m, uint k) {
  const uint e = pc.a_offset + m * pc.lda + k;
  vec4 v = vec4(0.0);
  if (m < pc.M && k < pc.K) {
    if (VECA == 1u) {
      v = A4[e >> 2];
    } else {
      [[unroll]] for (uint q = 0; q < 4u; ++q)
        if (k + q < pc.K) v[q] = A1[e + q];
    }
  }
  return OPERAND4(v);
}
// Elements c..c+3 of stored row r of W (TB = 1: row n, along k; TB = 0: row k, along n),
// dequantised (ROUND_F16: and rounded to fp16); zero outside W.
vec4 chunk_b(uint r, uint c) {
  const uint rows = TB == 1 ? pc.N : pc.K, cols = TB == 1 ? pc.K : pc.N;
  const uint e = r * cols + c;
  vec4 v = vec4(0.0);
  if (r < rows && c < cols) {
    if (VECB == 1u) {
      // e % 4 == 0: the 4 codes are the 2 bytes at byte (e/2) % 4 of word e/8, even elements
      // in the high nibbles.
      const uint bytes = nf4_packed[e >> 3] >> (8u * ((e >> 1) & 3u));
      const float absmax = nf4_block_absmax(e >> 6);
      v = vec4(code_sh[(bytes >> 4) & 0xfu], code_sh[bytes & 0xfu], code_sh[(bytes >> 12) & 0xfu],
               code_sh[(bytes >> 8) & 0xfu]) * absmax;
    } else {
      [[unroll]] for (uint q = 0; q < 4u; ++q)
        if (c + q < cols) v[q] = nf4_value(e + q);
    }
  }
  return OPERAND4(v);
}

// C[m][n..n+3] = alpha * acc (+ beta * C), the part inside C.
void store_c(uint m, uint n, vec4 acc) {
  const uint ci = pc.c_offset + m * pc.ldc + n;
  if (m < pc.M && n < pc.N) {
    if (VECC == 1u) {
      vec4 v = pc.alpha * acc;
      if (pc.beta != 0.0) v += pc.beta * C4[ci >> 2];
      C4[ci >> 2] = v;
    } else {
      [[unroll]] for (uint j = 0; j < 4u; ++j) {
        if (n + j < pc.N) {
          float v = pc.alpha * acc[j];
          if (pc.beta != 0.0) v += pc.beta * C1[ci + j];
          C1[ci + j] = v;
        }
      }
    }
  }
}

#include "gemm_scalar_core.glsl"

void main() {
  if (gl_LocalInvocationIndex < 16u) code_sh[gl_LocalInvocationIndex] = NF4_CODE[gl_LocalInvocationIndex];
  barrier();
  gemm_tiles(pc.K);
}
