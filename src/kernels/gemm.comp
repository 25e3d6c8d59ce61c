#version 450
// Scalar tiled GEMM (no matrix cores): fp32 arithmetic, fp32 or fp16 operands, fp32 C.
// See gemm_common.glsl for the operation and addressing. The gemm_f32f16 variants take an fp32 A
// and an fp16 B and round A to fp16 on load, so the product is that of two fp16 matrices with
// fp32 accumulation, as the cooperative-matrix kernel computes it (mixed precision without a
// cooperative-matrix device).
//
// A workgroup computes a BM x BN tile of C with (BM/TM) x (BN/TN) invocations, each holding
// TM x TN accumulators for rows ty + i*(BM/TM) and columns tx + j*(BN/TN) (strided, so that
// neighbouring invocations read neighbouring shared-memory words). K advances BK at a time
// through double-buffered shared tiles stored k-major; the next tile is fetched into registers
// while the current one is multiplied. Loads outside the matrix read as zero and stores outside
// it are skipped, so any M, N, K (including 1) works.
//
// Tile sizes are compile-time constants (variants), not specialization constants: register
// arrays sized by specialization constants ran about 10x slower on NVIDIA's compiler.
//! variant gemm_f32_t64 -DBM=64 -DBN=64 -DBK=16 -DTM=4 -DTN=4
//! variant gemm_f16_t64 -DF16_OPERANDS -DBM=64 -DBN=64 -DBK=16 -DTM=4 -DTN=4
//! variant gemm_f32_t128 -DBM=128 -DBN=128 -DBK=8 -DTM=8 -DTN=8
//! variant gemm_f16_t128 -DF16_OPERANDS -DBM=128 -DBN=128 -DBK=8 -DTM=8 -DTN=8
//! variant gemm_f32f16_t64 -DMIXED_OPERANDS -DBM=64 -DBN=64 -DBK=16 -DTM=4 -DTN=4
//! variant gemm_f32f16_t128 -DMIXED_OPERANDS -DBM=128 -DBN=128 -DBK=8 -DTM=8 -DTN=8
#extension GL_EXT_control_flow_attributes : require
#if defined(F16_OPERANDS) || defined(MIXED_OPERANDS)
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

layout(local_size_x = (BM / TM) * (BN / TN)) in;
layout(constant_id = 0) const uint TA = 0;
layout(constant_id = 1) const uint TB = 1;

#include "gemm_common.glsl"

#ifdef F16_OPERANDS
layout(set = 0, binding = 0) readonly buffer BufA { float16_t A[]; };
layout(set = 0, binding = 1) readonly buffer BufB { float16_t B[]; };
#define LOADA(i) float(A[i])
#define LOADB(i) float(B[i])
#elif defined(MIXED_OPERANDS)
layout(set = 0, binding = 0) readonly buffer BufA { float A[]; };
layout(set = 0, binding = 1) readonly buffer BufB { float16_t B[]; };
#define LOADA(i) float(float16_t(A[i]))
#define LOADB(i) float(B[i])
#else
layout(set = 0, binding = 0) readonly buffer BufA { float A[]; };
layout(set = 0, binding = 1) readonly buffer BufB { float B[]; };
#define LOADA(i) A[i]
#define LOADB(i) B[i]
#endif
layout(set = 0, binding = 2) buffer BufC { float C[]; };

const uint NTX = BN / TN;           // invocations along N
const uint NTY = BM / TM;           // along M
const uint NT = NTX * NTY;
const uint LA = (BM * BK + NT - 1) / NT;  // A elements each invocation loads per K tile
const uint LB = (BN * BK + NT - 1) / NT;
const uint SA = BM + 1;             // shared row stride (k-major rows), padded
const uint SB = BN + 1;

shared float As[2 * BK * SA];
shared float Bs[2 * BK * SB];

// Element x of the A tile at (m0, k0): its tile coordinates, chosen so that consecutive
// invocations read consecutive addresses of the stored layout.
void tile_coord_a(uint x, out uint m, out uint k) {
  if (TA == 0) { m = x / BK; k = x % BK; } else { k = x / BM; m = x % BM; }
}
void tile_coord_b(uint x, out uint n, out uint k) {
  if (TB == 1) { n = x / BK; k = x % BK; } else { k = x / BN; n = x % BN; }
}

float fetch_a(uint abase, uint m, uint k) {
  if (m >= pc.M || k >= pc.K) return 0.0;
  return LOADA(abase + (TA == 0 ? m * pc.lda + k : k * pc.lda + m));
}
float fetch_b(uint bbase, uint n, uint k) {
  if (n >= pc.N || k >= pc.K) return 0.0;
  return LOADB(bbase + (TB == 1 ? n * pc.ldb + k : k * pc.ldb + n));
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint tx = tid % NTX, ty = tid / NTX;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint batch = gl_WorkGroupID.z;
  const uint abase = pc.a_offset + batch * pc.a_stride;
  const uint bbase = pc.b_offset + batch * pc.b_stride;
  const uint cbase = pc.c_offset + batch * pc.c_stride;
  const uint numK = (pc.K + BK - 1) / BK;

  float acc[TM * TN];
  [[unroll]] for (uint i = 0; i < TM * TN; ++i) acc[i] = 0.0;

  float ra[LA], rb[LB];
  [[unroll]] for (uint i = 0; i < LA; ++i) {
    uint x = tid + i * NT, m, k;
    tile_coord_a(x, m, k);
    ra[i] = x < BM * BK ? fetch_a(abase, m0 + m, k) : 0.0;
  }
  [[unroll]] for (uint i = 0; i < LB; ++i) {
    uint x = tid + i * NT, n, k;
    tile_coord_b(x, n, k);
    rb[i] = x < BN * BK ? fetch_b(bbase, n0 + n, k) : 0.0;
  }

  uint stage = 0;
  for (uint kt = 0; kt < numK; ++kt) {
    // registers -> shared stage (the other stage may still be read by slower invocations of
    // the previous iteration only before the barrier at its end)
    [[unroll]] for (uint i = 0; i < LA; ++i) {
      uint x = tid + i * NT, m, k;
      tile_coord_a(x, m, k);
      if (x < BM * BK) As[stage * BK * SA + k * SA + m] = ra[i];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
      uint x = tid + i * NT, n, k;
      tile_coord_b(x, n, k);
      if (x < BN * BK) Bs[stage * BK * SB + k * SB + n] = rb[i];
    }
    barrier();
    if (kt + 1 < numK) {  // prefetch the next K tile; its latency hides behind the FMAs
      const uint k0 = (kt + 1) * BK;
      [[unroll]] for (uint i = 0; i < LA; ++i) {
        uint x = tid + i * NT, m, k;
        tile_coord_a(x, m, k);
        ra[i] = x < BM * BK ? fetch_a(abase, m0 + m, k0 + k) : 0.0;
      }
      [[unroll]] for (uint i = 0; i < LB; ++i) {
        uint x = tid + i * NT, n, k;
        tile_coord_b(x, n, k);
        rb[i] = x < BN * BK ? fetch_b(bbase, n0 + n, k0 + k) : 0.0;
      }
    }
    [[unroll]] for (uint k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      [[unroll]] for (uint i = 0; i < TM; ++i) a[i] = As[stage * BK * SA + k * SA + ty + i * NTY];
      [[unroll]] for (uint j = 0; j < TN; ++j) b[j] = Bs[stage * BK * SB + k * SB + tx + j * NTX];
      [[unroll]] for (uint i = 0; i < TM; ++i)
        [[unroll]] for (uint j = 0; j < TN; ++j) acc[i * TN + j] = fma(a[i], b[j], acc[i * TN + j]);
    }
    stage ^= 1u;
  }

  [[unroll]] for (uint i = 0; i < TM; ++i) {
    const uint m = m0 + ty + i * NTY;
    if (m >= pc.M) continue;
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      const uint n = n0 + tx + j * NTX;
      if (n >= pc.N) continue;
      const uint ci = cbase + m * pc.ldc + n;
      float v = pc.alpha * acc[i * TN + j];
      if (pc.beta != 0.0) v += pc.beta * C[ci];
      C[ci] = v;
    }
  }
}
