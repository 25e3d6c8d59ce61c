#version 450
// Scalar tiled GEMM (no matrix cores): fp32 arithmetic, fp32 or fp16 operands, fp32 C.
// See gemm_common.glsl for the operation and addressing.
//
// A workgroup computes a BM x BN tile of C. Each invocation holds QM x QN register blocks of
// 4x4 accumulators (one vec4 per row of a block): block (qm, qn) of invocation (tx, ty) covers
// rows qm*BM/QM + ty*4 + 0..3 and columns qn*BN/QN + tx*4 + 0..3. Both operand tiles sit in
// shared memory k-major as vec4s (As[k][m/4], Bs[k][n/4]), so one k step of the inner loop is
// QM + QN vec4 shared loads for 16*QM*QN FMAs; the invocations of a subgroup read neighbouring
// (or the same, broadcast) vec4s. Rows are padded by one vec4, which keeps the transposing
// stores (below) free of bank conflicts.
//
// Global memory is read in chunks of 4 consecutive elements of a stored row: along k when
// the operand is stored with k contiguous (A [M,K], B [N,K]; the chunk is scattered into 4
// k rows of the shared tile), along m or n otherwise (one vec4 store). K advances BK at a time
// through double-buffered shared tiles: the next tile is fetched into registers while the
// current one is multiplied, then stored to the other stage; one barrier per K step.
//
// VECA (VECB): the chunks of A (B) are single vec4 loads (f16: one uvec2 of 4 halves). The
// host sets it when the leading dimension, the offsets, the batch stride and the operand's
// contiguous extent are multiples of 4, so a chunk is either wholly inside the matrix or
// wholly outside it. Otherwise each element is loaded, and bounds-checked, on its own.
// VECC: C is read and written as vec4s, under the same conditions for ldc, offsets and N.
// Everything outside the matrices reads as zero and stores outside C are skipped, so any
// M, N, K (including 0 and 1) works; beta == 0 never reads C.
//
// Tile sizes are compile-time constants (variants), not specialization constants: register
// arrays sized by specialization constants ran about 10x slower on NVIDIA's compiler.
//! variant gemm_f32_t64 -DBM=64 -DBN=64 -DBK=16 -DQM=1 -DQN=1
//! variant gemm_f16_t64 -DF16_OPERANDS -DBM=64 -DBN=64 -DBK=16 -DQM=1 -DQN=1
//! variant gemm_f32_t128 -DBM=128 -DBN=128 -DBK=8 -DQM=2 -DQN=2
//! variant gemm_f16_t128 -DF16_OPERANDS -DBM=128 -DBN=128 -DBK=8 -DQM=2 -DQN=2
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = (BM / (4 * QM)) * (BN / (4 * QN))) in;
layout(constant_id = 0) const uint TA = 0;
layout(constant_id = 1) const uint TB = 1;
layout(constant_id = 2) const uint VECA = 0;
layout(constant_id = 3) const uint VECB = 0;
layout(constant_id = 4) const uint VECC = 0;

#include "gemm_common.glsl"

// Each operand binding is declared twice: as 4-element chunks and as single elements.
#ifdef F16_OPERANDS
layout(set = 0, binding = 0) readonly buffer BufA4 { uvec2 A4[]; };
layout(set = 0, binding = 0) readonly buffer BufA1 { uint A1[]; };
layout(set = 0, binding = 1) readonly buffer BufB4 { uvec2 B4[]; };
layout(set = 0, binding = 1) readonly buffer BufB1 { uint B1[]; };
vec4 halves4(uvec2 u) { return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)); }
vec4 load4_a(uint e) { return halves4(A4[e >> 2]); }
vec4 load4_b(uint e) { return halves4(B4[e >> 2]); }
float load1_a(uint e) { return unpackHalf2x16(A1[e >> 1])[e & 1u]; }
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

const uint NTX = BN / (4u * QN);  // invocations along N
const uint NTY = BM / (4u * QM);  // along M
const uint NT = NTX * NTY;
const uint RSA = BM / 4u + 1u;    // shared row stride in vec4s (one k row), padded
const uint RSB = BN / 4u + 1u;
// Chunks per stored row of a tile: a tile of A is BM rows of BK (TA = 0) or BK rows of BM.
const uint CA = TA == 0 ? BK / 4u : BM / 4u;
const uint CB = TB == 1 ? BK / 4u : BN / 4u;
const uint LA = (BM * BK / 4u + NT - 1u) / NT;  // chunks of A each invocation moves per K step
const uint LB = (BN * BK / 4u + NT - 1u) / NT;

shared vec4 As[2 * BK * RSA];
shared vec4 Bs[2 * BK * RSB];

// Chunk x of the A tile at (m0, k0): stored row r, elements c..c+3 of it.
vec4 fetch_a(uint abase, uint m0, uint k0, uint x) {
  if (x >= BM * BK / 4u) return vec4(0.0);
  const uint r = (TA == 0 ? m0 : k0) + x / CA;
  const uint c = (TA == 0 ? k0 : m0) + (x % CA) * 4u;
  const uint rows = TA == 0 ? pc.M : pc.K, cols = TA == 0 ? pc.K : pc.M;
  if (r >= rows || c >= cols) return vec4(0.0);
  const uint e = abase + r * pc.lda + c;
  if (VECA == 1u) return load4_a(e);
  vec4 v = vec4(0.0);
  [[unroll]] for (uint q = 0; q < 4u; ++q)
    if (c + q < cols) v[q] = load1_a(e + q);
  return v;
}
vec4 fetch_b(uint bbase, uint n0, uint k0, uint x) {
  if (x >= BN * BK / 4u) return vec4(0.0);
  const uint r = (TB == 1 ? n0 : k0) + x / CB;
  const uint c = (TB == 1 ? k0 : n0) + (x % CB) * 4u;
  const uint rows = TB == 1 ? pc.N : pc.K, cols = TB == 1 ? pc.K : pc.N;
  if (r >= rows || c >= cols) return vec4(0.0);
  const uint e = bbase + r * pc.ldb + c;
  if (VECB == 1u) return load4_b(e);
  vec4 v = vec4(0.0);
  [[unroll]] for (uint q = 0; q < 4u; ++q)
    if (c + q < cols) v[q] = load1_b(e + q);
  return v;
}

// Chunk x into shared stage `s` (k-major): a chunk along k goes to 4 rows, one along m to one.
void store_a(uint s, uint x, vec4 v) {
  if (x >= BM * BK / 4u) return;
  const uint base = s * BK * RSA;
  if (TA == 0) {
    const uint m = x / CA, k = (x % CA) * 4u;
    [[unroll]] for (uint q = 0; q < 4u; ++q) As[base + (k + q) * RSA + m / 4u][m % 4u] = v[q];
  } else {
    As[base + (x / CA) * RSA + x % CA] = v;
  }
}
void store_b(uint s, uint x, vec4 v) {
  if (x >= BN * BK / 4u) return;
  const uint base = s * BK * RSB;
  if (TB == 1) {
    const uint n = x / CB, k = (x % CB) * 4u;
    [[unroll]] for (uint q = 0; q < 4u; ++q) Bs[base + (k + q) * RSB + n / 4u][n % 4u] = v[q];
  } else {
    Bs[base + (x / CB) * RSB + x % CB] = v;
  }
}

// One element or vec4 of the result: alpha * acc (+ beta * C).
void store_c(uint cbase, uint m, uint n, vec4 acc) {
  if (m >= pc.M || n >= pc.N) return;
  const uint ci = cbase + m * pc.ldc + n;
  if (VECC == 1u) {
    vec4 v = pc.alpha * acc;
    if (pc.beta != 0.0) v += pc.beta * C4[ci >> 2];
    C4[ci >> 2] = v;
    return;
  }
  [[unroll]] for (uint j = 0; j < 4u; ++j) {
    if (n + j >= pc.N) break;
    float v = pc.alpha * acc[j];
    if (pc.beta != 0.0) v += pc.beta * C1[ci + j];
    C1[ci + j] = v;
  }
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint tx = tid % NTX, ty = tid / NTX;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint batch = gl_WorkGroupID.z;
  const uint abase = pc.a_offset + batch * pc.a_stride;
  const uint bbase = pc.b_offset + batch * pc.b_stride;
  const uint cbase = pc.c_offset + batch * pc.c_stride;
  const uint numK = (pc.K + BK - 1u) / BK;

  vec4 acc[QM * 4 * QN];  // acc[(qm*4 + i)*QN + qn]: row qm*BM/QM + ty*4 + i, columns of block qn
  [[unroll]] for (uint i = 0; i < QM * 4u * QN; ++i) acc[i] = vec4(0.0);

  vec4 ra[LA], rb[LB];
  [[unroll]] for (uint i = 0; i < LA; ++i) ra[i] = fetch_a(abase, m0, 0u, tid + i * NT);
  [[unroll]] for (uint i = 0; i < LB; ++i) rb[i] = fetch_b(bbase, n0, 0u, tid + i * NT);
  [[unroll]] for (uint i = 0; i < LA; ++i) store_a(0u, tid + i * NT, ra[i]);
  [[unroll]] for (uint i = 0; i < LB; ++i) store_b(0u, tid + i * NT, rb[i]);
  barrier();

  uint stage = 0;
  for (uint kt = 0; kt < numK; ++kt) {
    const bool more = kt + 1u < numK;
    if (more) {  // prefetch the next K tile; its latency hides behind the FMAs
      const uint k0 = (kt + 1u) * BK;
      [[unroll]] for (uint i = 0; i < LA; ++i) ra[i] = fetch_a(abase, m0, k0, tid + i * NT);
      [[unroll]] for (uint i = 0; i < LB; ++i) rb[i] = fetch_b(bbase, n0, k0, tid + i * NT);
    }
    const uint sa = stage * BK * RSA, sb = stage * BK * RSB;
    [[unroll]] for (uint k = 0; k < BK; ++k) {
      vec4 a[QM], b[QN];
      [[unroll]] for (uint qm = 0; qm < QM; ++qm) a[qm] = As[sa + k * RSA + qm * NTY + ty];
      [[unroll]] for (uint qn = 0; qn < QN; ++qn) b[qn] = Bs[sb + k * RSB + qn * NTX + tx];
      [[unroll]] for (uint qm = 0; qm < QM; ++qm)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
          [[unroll]] for (uint qn = 0; qn < QN; ++qn) {
            const uint t = (qm * 4u + i) * QN + qn;
            acc[t] = fma(vec4(a[qm][i]), b[qn], acc[t]);
          }
    }
    if (more) {
      stage ^= 1u;  // the other stage was last read before the previous barrier
      [[unroll]] for (uint i = 0; i < LA; ++i) store_a(stage, tid + i * NT, ra[i]);
      [[unroll]] for (uint i = 0; i < LB; ++i) store_b(stage, tid + i * NT, rb[i]);
      barrier();
    }
  }

  [[unroll]] for (uint qm = 0; qm < QM; ++qm)
    [[unroll]] for (uint i = 0; i < 4u; ++i)
      [[unroll]] for (uint qn = 0; qn < QN; ++qn)
        store_c(cbase, m0 + qm * (BM / QM) + ty * 4u + i, n0 + qn * (BN / QN) + tx * 4u,
                acc[(qm * 4u + i) * QN + qn]);
}
