#version 450
// Fused NF4 GEMM, scalar tiled (no matrix cores), fp32 arithmetic:
//   TB = 1 (forward):        C [M, N] = alpha * A [M, K] * W^T + beta * C,  W [N, K] NF4
//   TB = 0 (input gradient): C [M, N] = alpha * A [M, K] * W   + beta * C,  W [K, N] NF4
// A and C are fp32 row-major views (leading dimension and element offset in the push constants).
// The weight W (rows x cols, row-major, see nf4_common.glsl) is never dequantised as a whole:
// each BN x BK tile of op(W) is decoded element by element (nibble, absmax) while it is loaded,
// and staged in shared memory as fp32, exactly as gemm.comp stages its B operand.
//
// Tiling as gemm.comp: a workgroup computes a BM x BN tile of C with (BM/TM) x (BN/TN)
// invocations holding TM x TN accumulators; K advances BK at a time through double-buffered
// shared tiles, the next tile fetched into registers during the multiplies. Loads outside the
// matrices read as zero, stores outside C are skipped, so any M, N, K works.
//
// The nf4_gemm_f16 variants (ROUND_F16) round A and the decoded W to fp16 on load (fp32
// accumulation), the arithmetic of nf4_gemm_coopmat.comp: mixed precision on devices without
// cooperative matrices.
//! variant nf4_gemm_t64 -DBM=64 -DBN=64 -DBK=16 -DTM=4 -DTN=4
//! variant nf4_gemm_t128 -DBM=128 -DBN=128 -DBK=8 -DTM=8 -DTN=8
//! variant nf4_gemm_f16_t64 -DROUND_F16 -DBM=64 -DBN=64 -DBK=16 -DTM=4 -DTN=4
//! variant nf4_gemm_f16_t128 -DROUND_F16 -DBM=128 -DBN=128 -DBK=8 -DTM=8 -DTN=8
#extension GL_EXT_control_flow_attributes : require
#ifdef ROUND_F16
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define OPERAND(x) float(float16_t(x))
#else
#define OPERAND(x) (x)
#endif

layout(local_size_x = (BM / TM) * (BN / TN)) in;
layout(constant_id = 0) const uint TB = 1;
layout(constant_id = 1) const uint NF4_DQ = 0;

layout(push_constant) uniform Nf4GemmPush {
  uint M, N, K;
  uint lda, ldc;
  uint a_offset, c_offset;  // elements from the start of the A and C bindings
  float alpha, beta;        // beta == 0 never reads C (it may hold NaN)
  float absmax_offset;
} pc;
float nf4_offset() { return pc.absmax_offset; }

layout(set = 0, binding = 0) readonly buffer BufA { float A[]; };
#define NF4_PACKED_BINDING 1
#define NF4_ABSMAX_BINDING 2
#define NF4_NESTED_BINDING 3
#define NF4_CODE8_BINDING 4
#include "nf4_common.glsl"
layout(set = 0, binding = 5) buffer BufC { float C[]; };

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
void tile_coord_a(uint x, out uint m, out uint k) { m = x / BK; k = x % BK; }
void tile_coord_b(uint x, out uint n, out uint k) {
  if (TB == 1) { n = x / BK; k = x % BK; } else { k = x / BN; n = x % BN; }
}

float fetch_a(uint m, uint k) {
  if (m >= pc.M || k >= pc.K) return 0.0;
  return OPERAND(A[pc.a_offset + m * pc.lda + k]);
}
// Element (k, n) of op(W), decoded: W is [N, K] (TB = 1) or [K, N] (TB = 0), contiguous.
float fetch_b(uint n, uint k) {
  if (n >= pc.N || k >= pc.K) return 0.0;
  return OPERAND(nf4_value(TB == 1 ? n * pc.K + k : k * pc.N + n));
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint tx = tid % NTX, ty = tid / NTX;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint cbase = pc.c_offset;
  const uint numK = (pc.K + BK - 1) / BK;

  float acc[TM * TN];
  [[unroll]] for (uint i = 0; i < TM * TN; ++i) acc[i] = 0.0;

  float ra[LA], rb[LB];
  [[unroll]] for (uint i = 0; i < LA; ++i) {
    uint x = tid + i * NT, m, k;
    tile_coord_a(x, m, k);
    ra[i] = x < BM * BK ? fetch_a(m0 + m, k) : 0.0;
  }
  [[unroll]] for (uint i = 0; i < LB; ++i) {
    uint x = tid + i * NT, n, k;
    tile_coord_b(x, n, k);
    rb[i] = x < BN * BK ? fetch_b(n0 + n, k) : 0.0;
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
        ra[i] = x < BM * BK ? fetch_a(m0 + m, k0 + k) : 0.0;
      }
      [[unroll]] for (uint i = 0; i < LB; ++i) {
        uint x = tid + i * NT, n, k;
        tile_coord_b(x, n, k);
        rb[i] = x < BN * BK ? fetch_b(n0 + n, k0 + k) : 0.0;
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
