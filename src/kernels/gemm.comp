#version 450
// Scalar tiled GEMM (no matrix cores): fp32 arithmetic, fp32 or fp16 operands (or fp32 A with
// fp16 B), fp32 C.
// Operation and addressing: gemm_common.glsl; tiling and main loop: gemm_scalar_core.glsl.
// Batch b = gl_WorkGroupID.z.
//
// The gemm_f32f16 variants (MIXED_OPERANDS) take an fp32 A and an fp16 B and round A to fp16 on
// load, so the product is that of two fp16 matrices with fp32 accumulation, as the
// cooperative-matrix kernel computes it (mixed precision without a cooperative-matrix device).
//
// VECA (VECB): the 4-element chunks of A (B) are single vec4 loads (fp16: one uvec2 of 4
// halves). The host sets it when the leading dimension, the offsets, the batch stride and the
// operand's contiguous extent are multiples of 4, so a chunk is either wholly inside the
// matrix or wholly outside it. Otherwise each element is loaded, and bounds-checked, on its
// own. VECC: C is read and written as vec4s, under the same conditions for ldc, offsets and N.
// Everything outside the matrices reads as zero and stores outside C are skipped, so any
// M, N, K (including 0 and 1) works; beta == 0 never reads C.
//! variant gemm_f32_t64 -DBM=64 -DBN=64 -DBK=16 -DQM=1 -DQN=1
//! variant gemm_f16_t64 -DF16_OPERANDS -DBM=64 -DBN=64 -DBK=16 -DQM=1 -DQN=1
//! variant gemm_f32_t128 -DBM=128 -DBN=128 -DBK=8 -DQM=2 -DQN=2
//! variant gemm_f16_t128 -DF16_OPERANDS -DBM=128 -DBN=128 -DBK=8 -DQM=2 -DQN=2
//! variant gemm_f32f16_t64 -DMIXED_OPERANDS -DBM=64 -DBN=64 -DBK=16 -DQM=1 -DQN=1
//! variant gemm_f32f16_t128 -DMIXED_OPERANDS -DBM=128 -DBN=128 -DBK=8 -DQM=2 -DQN=2
#extension GL_EXT_control_flow_attributes : require
#ifdef MIXED_OPERANDS
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

layout(local_size_x = (BM / (4 * QM)) * (BN / (4 * QN))) in;
layout(constant_id = 0) const uint TA = 0;
layout(constant_id = 1) const uint TB = 1;
layout(constant_id = 2) const uint VECA = 0;
layout(constant_id = 3) const uint VECB = 0;
layout(constant_id = 4) const uint VECC = 0;

#include "gemm_common.glsl"

// Each operand binding is declared twice: as 4-element chunks and as single elements.
vec4 halves4(uvec2 u) { return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)); }
#ifdef F16_OPERANDS
layout(set = 0, binding = 0) readonly buffer BufA4 { uvec2 A4[]; };
layout(set = 0, binding = 0) readonly buffer BufA1 { uint A1[]; };
layout(set = 0, binding = 1) readonly buffer BufB4 { uvec2 B4[]; };
layout(set = 0, binding = 1) readonly buffer BufB1 { uint B1[]; };
vec4 load4_a(uint e) { return halves4(A4[e >> 2]); }
vec4 load4_b(uint e) { return halves4(B4[e >> 2]); }
float load1_a(uint e) { return unpackHalf2x16(A1[e >> 1])[e & 1u]; }
float load1_b(uint e) { return unpackHalf2x16(B1[e >> 1])[e & 1u]; }
#elif defined(MIXED_OPERANDS)
layout(set = 0, binding = 0) readonly buffer BufA4 { vec4 A4[]; };
layout(set = 0, binding = 0) readonly buffer BufA1 { float A1[]; };
layout(set = 0, binding = 1) readonly buffer BufB4 { uvec2 B4[]; };
layout(set = 0, binding = 1) readonly buffer BufB1 { uint B1[]; };
// A rounded to fp16 (the conversion the cooperative-matrix kernel applies while staging A).
#include "f16_round.glsl"
vec4 load4_a(uint e) { return round_to_f16(A4[e >> 2]); }
vec4 load4_b(uint e) { return halves4(B4[e >> 2]); }
float load1_a(uint e) { return round_to_f16(A1[e]); }
float load1_b(uint e) { return unpackHalf2x16(B1[e >> 1])[e & 1u]; }
#else
layout(set = 0, binding = 0) readonly buffer BufA4 { vec4 A4[]; };
layout(set = 0, binding = 0) readonly buffer BufA1 { float A1[]; };
layout(set = 0, binding = 1) readonly buffer BufB4 { vec4 B4[]; };
layout(set = 0, binding = 1) readonly buffer BufB1 { float B1[]; };
vec4 load4_a(uint e) { return A4[e >> 2]; }
vec4 load4_b(uint e) { return B4[e >> 2]; }
float load1_a(uint e) { return A1[e]; }
float load1_b(uint e) { return B1[e]; }
#endif
layout(set = 0, binding = 2) buffer BufC4 { vec4 C4[]; };
layout(set = 0, binding = 2) buffer BufC1 { float C1[]; };

uint abase, bbase, cbase;  // element offsets of this workgroup's batch (set in main)

// Elements c..c+3 of stored row r of A (B), zero outside the matrix. (No early returns: see
// gemm_scalar_core.glsl.)
vec4 chunk_a(uint r, uint c) {
  const uint rows = TA == 0 ? pc.M : pc.K, cols = TA == 0 ? pc.K : pc.M;
  const uint e = abase + r * pc.lda + c;
  vec4 v = vec4(0.0);
  if (r < rows && c < cols) {
    if (VECA == 1u) {
      v = load4_a(e);
    } else {
      [[unroll]] for (uint q = 0; q < 4u; ++q)
        if (c + q < cols) v[q] = load1_a(e + q);
    }
  }
  return v;
}
vec4 chunk_b(uint r, uint c) {
  const uint rows = TB == 1 ? pc.N : pc.K, cols = TB == 1 ? pc.K : pc.N;
  const uint e = bbase + r * pc.ldb + c;
  vec4 v = vec4(0.0);
  if (r < rows && c < cols) {
    if (VECB == 1u) {
      v = load4_b(e);
    } else {
      [[unroll]] for (uint q = 0; q < 4u; ++q)
        if (c + q < cols) v[q] = load1_b(e + q);
    }
  }
  return v;
}

// C[m][n..n+3] = alpha * acc (+ beta * C), the part inside C.
void store_c(uint m, uint n, vec4 acc) {
  const uint ci = cbase + m * pc.ldc + n;
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
  const uint batch = gl_WorkGroupID.z;
  abase = pc.a_offset + batch * pc.a_stride;
  bbase = pc.b_offset + batch * pc.b_stride;
  cbase = pc.c_offset + batch * pc.c_stride;
  gemm_tiles(pc.K);
}
