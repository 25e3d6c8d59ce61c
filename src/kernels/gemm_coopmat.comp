#version 450
// GEMM on matrix cores through GL_NV_cooperative_matrix (v1) or GL_KHR_cooperative_matrix (-DKHR):
// fp16 operands, fp32 accumulation, fp32 C, all four transpose combinations (gemm_common.glsl).
//
// Workgroup tile BM x BN, K step BK, WM x WN subgroups of SG invocations, each owning a
// (BM/WM) x (BN/WN) block held as TM x TN accumulators of FM x FN. The fragment shape
// FM x FN x FK and the subgroup size SG are specialization constants: NV v1 uses 16x16x16 at
// subgroup 32; the KHR variants take the shape the device lists (AMD 16x16x16 at wave 32 or 64,
// Intel other shapes), each a multiple of 8. Tiles are staged in shared
// memory in the operand's stored layout (8 halves = one uvec4 per chunk, rows padded by one
// chunk against bank conflicts); the cooperative-matrix load's column-major flag does the
// transposes. The next K tile is fetched into registers during the multiplies (NSTAGES = 2:
// double-buffered shared tiles, one barrier per K step; 1: reused, two barriers).
//
// Edges: with VECA (VECB) the operand is read 8 halves at a time, which needs its leading
// dimension, offsets and contiguous extent to be multiples of 8 (the host checks); otherwise
// halves are read one by one. Everything outside the matrix reads as zero, and the epilogue
// goes through shared memory so that alpha, beta and the bounds apply per element.
//
// gemm_nvcm_emu replaces each cooperative-matrix operation with scalar code that follows the
// cooperative-matrix definitions, for any fragment shape and subgroup size, so the tiling and
// addressing of both families run (and are tested) on devices without matrix cores, lavapipe
// included.
//
// The _af32 variants (A_F32) take an fp32 A and round it to fp16 while staging it (as
// nf4_gemm_coopmat.comp does with x), so mixed-precision training multiplies its fp32
// activations by fp16 weights without an fp16 copy of the activations. VECA then reads two vec4
// per chunk; its conditions (in elements) are the same.
//! variant gemm_nvcm requires=nv_coopmat
//! variant gemm_nvcm_emu -DEMULATE
//! variant gemm_nvcm_af32 -DA_F32 requires=nv_coopmat
//! variant gemm_nvcm_af32_emu -DA_F32 -DEMULATE
//! variant gemm_khr -DKHR requires=khr_coopmat
//! variant gemm_khr_af32 -DKHR -DA_F32 requires=khr_coopmat
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : enable  // for glslang (glslc turns it on itself)
#if defined(KHR)
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#elif !defined(EMULATE)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint BK = 32;
layout(constant_id = 4) const uint WM = 2;
layout(constant_id = 5) const uint WN = 2;
layout(constant_id = 6) const uint NSTAGES = 2;
layout(constant_id = 7) const uint TA = 0;
layout(constant_id = 8) const uint TB = 1;
layout(constant_id = 9) const uint VECA = 1;
layout(constant_id = 10) const uint VECB = 1;
layout(constant_id = 11) const uint SG = 32;  // subgroup size (the host requires it)
layout(constant_id = 12) const uint FM = 16;  // fragment: A is FM x FK, B FK x FN, C FM x FN
layout(constant_id = 13) const uint FN = 16;
layout(constant_id = 14) const uint FK = 16;

#include "gemm_common.glsl"

#ifdef A_F32
layout(set = 0, binding = 0) readonly buffer BufA4 { vec4 A4[]; };
layout(set = 0, binding = 0) readonly buffer BufA1 { float A1[]; };
#else
layout(set = 0, binding = 0) readonly buffer BufA4 { uvec4 A4[]; };
layout(set = 0, binding = 0) readonly buffer BufA1 { uint A1[]; };
#endif
layout(set = 0, binding = 1) readonly buffer BufB4 { uvec4 B4[]; };
layout(set = 0, binding = 1) readonly buffer BufB1 { uint B1[]; };
layout(set = 0, binding = 2) buffer BufC { float C[]; };

const uint NT = WM * WN * SG;
const uint FMN = FM * FN;          // accumulator elements
const uint PER_LANE = FMN / SG;     // of them per lane (the host checks FMN % SG == 0)
// A tile in shared memory: RA rows of CA chunks (TA = 0: rows m, chunks along k; TA = 1: rows k,
// chunks along m). Likewise B (TB = 1: rows n, chunks along k; TB = 0: rows k, chunks along n).
const uint RA = TA == 0 ? BM : BK;
const uint CA = TA == 0 ? BK / 8u : BM / 8u;
const uint SA = CA + 1u;
const uint RB = TB == 1 ? BN : BK;
const uint CB = TB == 1 ? BK / 8u : BN / 8u;
const uint SB = CB + 1u;
const uint A_STAGE = RA * SA;
const uint B_STAGE = RB * SB;
const uint LA = (RA * CA + NT - 1u) / NT;
const uint LB = (RB * CB + NT - 1u) / NT;
const uint TM = BM / WM / FM;
const uint TN = BN / WN / FN;

shared uvec4 Ash[NSTAGES * A_STAGE];
shared uvec4 Bsh[NSTAGES * B_STAGE];
shared float Csh[WM * WN * FMN];  // epilogue: one accumulator tile per subgroup

#ifdef A_F32
uint half_bits_b(uint h) {  // the 16 bits of half number h of B
  uint w = B1[h >> 1];
  return (h & 1u) == 0u ? (w & 0xffffu) : (w >> 16);
}
// 8 fp32 values as 8 halves (round to nearest even).
uvec4 pack8(float v[8]) {
  uint u[4];
  [[unroll]] for (uint i = 0; i < 4u; ++i) u[i] = packFloat2x16(f16vec2(float16_t(v[2u * i]), float16_t(v[2u * i + 1u])));
  return uvec4(u[0], u[1], u[2], u[3]);
}
#else
uint half_bits(bool fromA, uint h) {  // the 16 bits of half number h of A or B
  uint w = fromA ? A1[h >> 1] : B1[h >> 1];
  return (h & 1u) == 0u ? (w & 0xffffu) : (w >> 16);
}
uint half_bits_b(uint h) { return half_bits(false, h); }
#endif

// Chunk x of the A tile whose origin is (m0, k0): 8 consecutive halves of the stored layout.
uvec4 load_chunk_a(uint base, uint m0, uint k0, uint x) {
  const uint row = x / CA, ch = x % CA;
  // (r, c0): index along the strided dim and first index along the contiguous dim
  const uint r = TA == 0 ? m0 + row : k0 + row;
  const uint c0 = TA == 0 ? k0 + ch * 8u : m0 + ch * 8u;
  const uint rows = TA == 0 ? pc.M : pc.K, cols = TA == 0 ? pc.K : pc.M;
  if (r >= rows || c0 >= cols) return uvec4(0);
  const uint h = base + r * pc.lda + c0;
#ifdef A_F32
  float f[8];
  if (VECA == 1u) {
    const vec4 lo = A4[h >> 2], hi = A4[(h >> 2) + 1u];
    f = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
  } else {
    [[unroll]] for (uint i = 0; i < 8u; ++i) f[i] = c0 + i < cols ? A1[h + i] : 0.0;
  }
  return pack8(f);
#else
  if (VECA == 1u) return A4[h >> 3];
  uint v[8];
  [[unroll]] for (uint i = 0; i < 8u; ++i) v[i] = c0 + i < cols ? half_bits(true, h + i) : 0u;
  return uvec4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16), v[6] | (v[7] << 16));
#endif
}
uvec4 load_chunk_b(uint base, uint n0, uint k0, uint x) {
  const uint row = x / CB, ch = x % CB;
  const uint r = TB == 1 ? n0 + row : k0 + row;
  const uint c0 = TB == 1 ? k0 + ch * 8u : n0 + ch * 8u;
  const uint rows = TB == 1 ? pc.N : pc.K, cols = TB == 1 ? pc.K : pc.N;
  if (r >= rows || c0 >= cols) return uvec4(0);
  const uint h = base + r * pc.ldb + c0;
  if (VECB == 1u) return B4[h >> 3];
  uint v[8];
  [[unroll]] for (uint i = 0; i < 8u; ++i) v[i] = c0 + i < cols ? half_bits_b(h + i) : 0u;
  return uvec4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16), v[6] | (v[7] << 16));
}

// Position (in uvec4 units) and orientation of the operand fragments inside a stage.
// A (rows m, cols k) at tile offset (mi, ki): TA = 0 row-major, TA = 1 column-major.
uint a_elem(uint mi, uint ki) { return TA == 0 ? mi * SA + ki / 8u : ki * SA + mi / 8u; }
// B (rows k, cols n) at (ki, ni): TB = 1 column-major, TB = 0 row-major.
uint b_elem(uint ki, uint ni) { return TB == 1 ? ni * SB + ki / 8u : ki * SB + ni / 8u; }
const bool A_COLMAJOR = TA == 1;
const bool B_COLMAJOR = TB == 1;

#if defined(KHR)
#define ACC_T coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator>
#define A_T coopmat<float16_t, gl_ScopeSubgroup, FM, FK, gl_MatrixUseA>
#define B_T coopmat<float16_t, gl_ScopeSubgroup, FK, FN, gl_MatrixUseB>
#define DECL_ACC ACC_T acc[TM * TN]
#define ZERO_ACC(t) acc[t] = ACC_T(0.0)
#define DECL_AB A_T fa[TM]; B_T fb
// The layout operand must be a constant: one load per orientation, chosen by a specialization constant.
#define LOAD_A(i, el) if (A_COLMAJOR) coopMatLoad(fa[i], Ash, (el), SA, gl_CooperativeMatrixLayoutColumnMajor); \
    else coopMatLoad(fa[i], Ash, (el), SA, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_B(el) if (B_COLMAJOR) coopMatLoad(fb, Bsh, (el), SB, gl_CooperativeMatrixLayoutColumnMajor); \
    else coopMatLoad(fb, Bsh, (el), SB, gl_CooperativeMatrixLayoutRowMajor)
#define MMA(i, t) acc[t] = coopMatMulAdd(fa[i], fb, acc[t])
#define STORE_TILE(t, el) coopMatStore(acc[t], Csh, (el), FN, gl_CooperativeMatrixLayoutRowMajor)
#define SUBGROUP_ID gl_SubgroupID
#define LANE gl_SubgroupInvocationID
#elif !defined(EMULATE)
#define ACC_T fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define IN_T fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define DECL_ACC ACC_T acc[TM * TN]
#define ZERO_ACC(t) acc[t] = ACC_T(0.0)
#define DECL_AB IN_T fa[TM]; IN_T fb
#define LOAD_A(i, el) coopMatLoadNV(fa[i], Ash, (el), SA, A_COLMAJOR)
#define LOAD_B(el) coopMatLoadNV(fb, Bsh, (el), SB, B_COLMAJOR)
#define MMA(i, t) acc[t] = coopMatMulAddNV(fa[i], fb, acc[t])
#define STORE_TILE(t, el) coopMatStoreNV(acc[t], Csh, (el), 16u, false)
#define SUBGROUP_ID gl_SubgroupID
#define LANE gl_SubgroupInvocationID
#else
// Virtual subgroups of SG consecutive invocations. An accumulator is spread over its lanes,
// PER_LANE elements each (element e of lane L is matrix index L + SG*e, row-major); A and B
// operands are held whole by every lane.
float half_at(bool fromA, uint h) {  // h: index in halves into Ash / Bsh
  uint w = fromA ? Ash[h >> 3][(h >> 1) & 3u] : Bsh[h >> 3][(h >> 1) & 3u];
  return unpackHalf2x16(w)[h & 1u];
}
// element (r, c) of a fragment at chunk `el`: row-major at (el + r*stride)*8 + c,
// column-major at (el + c*stride)*8 + r
#define DECL_ACC float acc[TM * TN * PER_LANE]
#define ZERO_ACC(t) [[unroll]] for (uint e_ = 0; e_ < PER_LANE; ++e_) acc[(t) * PER_LANE + e_] = 0.0
#define DECL_AB float fa[TM * FM * FK]; float fb[FK * FN]
#define LOAD_A(i, el) for (uint r_ = 0; r_ < FM; ++r_) for (uint c_ = 0; c_ < FK; ++c_) \
    fa[(i) * FM * FK + r_ * FK + c_] = half_at(true, A_COLMAJOR ? ((el) + c_ * SA) * 8u + r_ : ((el) + r_ * SA) * 8u + c_)
#define LOAD_B(el) for (uint r_ = 0; r_ < FK; ++r_) for (uint c_ = 0; c_ < FN; ++c_) \
    fb[r_ * FN + c_] = half_at(false, B_COLMAJOR ? ((el) + c_ * SB) * 8u + r_ : ((el) + r_ * SB) * 8u + c_)
#define MMA(i, t) for (uint e_ = 0; e_ < PER_LANE; ++e_) { \
    uint x_ = LANE + SG * e_; uint r_ = x_ / FN, c_ = x_ % FN; float s_ = acc[(t) * PER_LANE + e_]; \
    for (uint k_ = 0; k_ < FK; ++k_) s_ += fa[(i) * FM * FK + r_ * FK + k_] * fb[k_ * FN + c_]; \
    acc[(t) * PER_LANE + e_] = s_; }
#define STORE_TILE(t, el) for (uint e_ = 0; e_ < PER_LANE; ++e_) Csh[(el) + LANE + SG * e_] = acc[(t) * PER_LANE + e_]
#define SUBGROUP_ID (gl_LocalInvocationIndex / SG)
#define LANE (gl_LocalInvocationIndex % SG)
#endif

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint sg = SUBGROUP_ID;
  const uint sgm = sg / WN, sgn = sg % WN;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint batch = gl_WorkGroupID.z;
  const uint abase = pc.a_offset + batch * pc.a_stride;
  const uint bbase = pc.b_offset + batch * pc.b_stride;
  const uint cbase = pc.c_offset + batch * pc.c_stride;
  const uint numK = (pc.K + BK - 1u) / BK;

  DECL_ACC;
  [[unroll]] for (uint t = 0; t < TM * TN; ++t) { ZERO_ACC(t); }

  uvec4 ra[LA], rb[LB];
  [[unroll]] for (uint i = 0; i < LA; ++i) {
    uint x = tid + i * NT;
    ra[i] = x < RA * CA ? load_chunk_a(abase, m0, 0u, x) : uvec4(0);
  }
  [[unroll]] for (uint i = 0; i < LB; ++i) {
    uint x = tid + i * NT;
    rb[i] = x < RB * CB ? load_chunk_b(bbase, n0, 0u, x) : uvec4(0);
  }
  [[unroll]] for (uint i = 0; i < LA; ++i) {
    uint x = tid + i * NT;
    if (x < RA * CA) Ash[(x / CA) * SA + x % CA] = ra[i];
  }
  [[unroll]] for (uint i = 0; i < LB; ++i) {
    uint x = tid + i * NT;
    if (x < RB * CB) Bsh[(x / CB) * SB + x % CB] = rb[i];
  }
  barrier();

  uint stage = 0;
  for (uint kt = 0; kt < numK; ++kt) {
    const bool more = kt + 1u < numK;
    if (more) {
      const uint k0 = (kt + 1u) * BK;
      [[unroll]] for (uint i = 0; i < LA; ++i) {
        uint x = tid + i * NT;
        ra[i] = x < RA * CA ? load_chunk_a(abase, m0, k0, x) : uvec4(0);
      }
      [[unroll]] for (uint i = 0; i < LB; ++i) {
        uint x = tid + i * NT;
        rb[i] = x < RB * CB ? load_chunk_b(bbase, n0, k0, x) : uvec4(0);
      }
    }
    const uint as = stage * A_STAGE, bs = stage * B_STAGE;
    [[unroll]] for (uint kk = 0; kk < BK / FK; ++kk) {
      DECL_AB;
      [[unroll]] for (uint i = 0; i < TM; ++i) { LOAD_A(i, as + a_elem((sgm * TM + i) * FM, kk * FK)); }
      [[unroll]] for (uint j = 0; j < TN; ++j) {
        LOAD_B(bs + b_elem(kk * FK, (sgn * TN + j) * FN));
        [[unroll]] for (uint i = 0; i < TM; ++i) { MMA(i, i * TN + j); }
      }
    }
    if (more) {
      if (NSTAGES == 1u) {
        barrier();
      } else {
        stage ^= 1u;  // the other stage was last read before the previous barrier
      }
      const uint as2 = stage * A_STAGE, bs2 = stage * B_STAGE;
      [[unroll]] for (uint i = 0; i < LA; ++i) {
        uint x = tid + i * NT;
        if (x < RA * CA) Ash[as2 + (x / CA) * SA + x % CA] = ra[i];
      }
      [[unroll]] for (uint i = 0; i < LB; ++i) {
        uint x = tid + i * NT;
        if (x < RB * CB) Bsh[bs2 + (x / CB) * SB + x % CB] = rb[i];
      }
      barrier();
    }
  }

  // Epilogue: each accumulator through the subgroup's scratch tile, then per element.
  const uint cm = m0 + sgm * TM * FM, cn = n0 + sgn * TN * FN;
  [[unroll]] for (uint i = 0; i < TM; ++i) {
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      barrier();
      STORE_TILE(i * TN + j, sg * FMN);
      barrier();
      [[unroll]] for (uint e = 0; e < PER_LANE; ++e) {
        const uint x = LANE + SG * e;
        const uint m = cm + i * FM + x / FN, n = cn + j * FN + x % FN;
        if (m < pc.M && n < pc.N) {
          const uint ci = cbase + m * pc.ldc + n;
          float v = pc.alpha * Csh[sg * FMN + x];
          if (pc.beta != 0.0) v += pc.beta * C[ci];
          C[ci] = v;
        }
      }
    }
  }
}
