#version 450
// Fused NF4 GEMM on matrix cores through GL_NV_cooperative_matrix: x (dy) and the decoded
// weight rounded to fp16 on load, fp32 accumulation, fp32 C:
//   TB = 1 (forward):        C [M, N] = alpha * A [M, K] * W^T + beta * C,  W [N, K] NF4
//   TB = 0 (input gradient): C [M, N] = alpha * A [M, K] * W   + beta * C,  W [K, N] NF4
// A (fp32) and C are row-major views as in nf4_gemm.comp; W is never dequantised as a whole.
//
// The tiling is gemm_coopmat.comp's (read its header): BM x BN workgroup tile, K step BK, WM x WN
// subgroups of 32, tiles staged in shared memory as halves, 8 per uvec4 chunk, in the stored
// layout (A: rows m; B: rows n for TB = 1, column-major operand; rows k for TB = 0). A chunk of
// W is 8 consecutive elements of one row of W: with VECB (cols % 8 == 0) that is one packed
// word in one block of 64, decoded with one absmax lookup; otherwise element by element. With
// VECA (K and the A offset multiples of 8 and 4) a chunk of A is two vec4 loads.
//
// nf4_gemm_nvcm_emu emulates the cooperative-matrix operations in scalar code, so the tiling and
// addressing run (and are tested) on lavapipe.
//! variant nf4_gemm_nvcm requires=nv_coopmat
//! variant nf4_gemm_nvcm_emu -DEMULATE
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#ifndef EMULATE
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint BK = 32;
layout(constant_id = 4) const uint WM = 2;
layout(constant_id = 5) const uint WN = 2;
layout(constant_id = 6) const uint TB = 1;
layout(constant_id = 7) const uint NF4_DQ = 0;
layout(constant_id = 8) const uint VECA = 0;
layout(constant_id = 9) const uint VECB = 0;
const uint NSTAGES = 2;
const uint TA = 0;

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
layout(set = 0, binding = 5) buffer BufC { float C[]; };

const uint NT = WM * WN * 32u;
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
const uint TM = BM / WM / 16u;
const uint TN = BN / WN / 16u;

shared uvec4 Ash[NSTAGES * A_STAGE];
shared uvec4 Bsh[NSTAGES * B_STAGE];
shared float Csh[WM * WN * 256u];  // epilogue: one 16x16 tile per subgroup

// 8 fp32 values as 8 halves (round to nearest even).
uvec4 pack8(float v[8]) {
  uint u[4];
  [[unroll]] for (uint i = 0; i < 4u; ++i) u[i] = packFloat2x16(f16vec2(float16_t(v[2u * i]), float16_t(v[2u * i + 1u])));
  return uvec4(u[0], u[1], u[2], u[3]);
}

// Chunk x of the A tile whose origin is (m0, k0): row m0 + x / CA, 8 consecutive k.
uvec4 load_chunk_a(uint m0, uint k0, uint x) {
  const uint r = m0 + x / CA, c0 = k0 + (x % CA) * 8u;
  if (r >= pc.M || c0 >= pc.K) return uvec4(0);
  const uint i0 = pc.a_offset + r * pc.lda + c0;
  float v[8];
  if (VECA == 1u) {
    const vec4 lo = A4[i0 >> 2], hi = A4[(i0 >> 2) + 1u];
    v = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
  } else {
    [[unroll]] for (uint i = 0; i < 8u; ++i) v[i] = c0 + i < pc.K ? A1[i0 + i] : 0.0;
  }
  return pack8(v);
}
// Chunk x of the B tile at (n0, k0): 8 consecutive elements of W along its contiguous
// dimension (TB = 1: row n, 8 k; TB = 0: row k, 8 n), decoded from NF4.
uvec4 load_chunk_b(uint n0, uint k0, uint x) {
  const uint row = x / CB, ch = x % CB;
  const uint r = TB == 1 ? n0 + row : k0 + row;
  const uint c0 = TB == 1 ? k0 + ch * 8u : n0 + ch * 8u;
  const uint rows = TB == 1 ? pc.N : pc.K, cols = TB == 1 ? pc.K : pc.N;
  if (r >= rows || c0 >= cols) return uvec4(0);
  const uint e0 = r * cols + c0;
  float v[8];
  if (VECB == 1u) {  // cols % 8 == 0: one packed word, one block
    nf4_decode_word(e0 >> 3, nf4_block_absmax(e0 >> 6), v);
  } else {
    [[unroll]] for (uint i = 0; i < 8u; ++i) v[i] = c0 + i < cols ? nf4_value(e0 + i) : 0.0;
  }
  return pack8(v);
}

// Position (in uvec4 units) and orientation of the 16x16 operand tiles inside a stage.
// A (rows m, cols k) at tile offset (mi, ki): TA = 0 row-major, TA = 1 column-major.
uint a_elem(uint mi, uint ki) { return TA == 0 ? mi * SA + ki / 8u : ki * SA + mi / 8u; }
// B (rows k, cols n) at (ki, ni): TB = 1 column-major, TB = 0 row-major.
uint b_elem(uint ki, uint ni) { return TB == 1 ? ni * SB + ki / 8u : ki * SB + ni / 8u; }
const bool A_COLMAJOR = TA == 1;
const bool B_COLMAJOR = TB == 1;

#ifndef EMULATE
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
// Virtual subgroups of 32 consecutive invocations. An accumulator is spread over its lanes,
// 8 elements each (element e of lane L is matrix index L + 32e, row-major); A and B operands
// are held whole by every lane.
float half_at(bool fromA, uint h) {  // h: index in halves into Ash / Bsh
  uint w = fromA ? Ash[h >> 3][(h >> 1) & 3u] : Bsh[h >> 3][(h >> 1) & 3u];
  return unpackHalf2x16(w)[h & 1u];
}
// element (r, c) of a 16x16 tile at chunk `el`: row-major at (el + r*stride)*8 + c,
// column-major at (el + c*stride)*8 + r
#define DECL_ACC float acc[TM * TN * 8]
#define ZERO_ACC(t) [[unroll]] for (uint e_ = 0; e_ < 8u; ++e_) acc[(t) * 8u + e_] = 0.0
#define DECL_AB float fa[TM * 256]; float fb[256]
#define LOAD_A(i, el) for (uint r_ = 0; r_ < 16u; ++r_) for (uint c_ = 0; c_ < 16u; ++c_) \
    fa[(i) * 256u + r_ * 16u + c_] = half_at(true, A_COLMAJOR ? ((el) + c_ * SA) * 8u + r_ : ((el) + r_ * SA) * 8u + c_)
#define LOAD_B(el) for (uint r_ = 0; r_ < 16u; ++r_) for (uint c_ = 0; c_ < 16u; ++c_) \
    fb[r_ * 16u + c_] = half_at(false, B_COLMAJOR ? ((el) + c_ * SB) * 8u + r_ : ((el) + r_ * SB) * 8u + c_)
#define MMA(i, t) for (uint e_ = 0; e_ < 8u; ++e_) { \
    uint x_ = LANE + 32u * e_; uint r_ = x_ >> 4, c_ = x_ & 15u; float s_ = acc[(t) * 8u + e_]; \
    for (uint k_ = 0; k_ < 16u; ++k_) s_ += fa[(i) * 256u + r_ * 16u + k_] * fb[k_ * 16u + c_]; \
    acc[(t) * 8u + e_] = s_; }
#define STORE_TILE(t, el) for (uint e_ = 0; e_ < 8u; ++e_) Csh[(el) + LANE + 32u * e_] = acc[(t) * 8u + e_]
#define SUBGROUP_ID (gl_LocalInvocationIndex / 32u)
#define LANE (gl_LocalInvocationIndex % 32u)
#endif

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint sg = SUBGROUP_ID;
  const uint sgm = sg / WN, sgn = sg % WN;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint cbase = pc.c_offset;
  const uint numK = (pc.K + BK - 1u) / BK;

  DECL_ACC;
  [[unroll]] for (uint t = 0; t < TM * TN; ++t) { ZERO_ACC(t); }

  uvec4 ra[LA], rb[LB];
  [[unroll]] for (uint i = 0; i < LA; ++i) {
    uint x = tid + i * NT;
    ra[i] = x < RA * CA ? load_chunk_a(m0, 0u, x) : uvec4(0);
  }
  [[unroll]] for (uint i = 0; i < LB; ++i) {
    uint x = tid + i * NT;
    rb[i] = x < RB * CB ? load_chunk_b(n0, 0u, x) : uvec4(0);
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
        ra[i] = x < RA * CA ? load_chunk_a(m0, k0, x) : uvec4(0);
      }
      [[unroll]] for (uint i = 0; i < LB; ++i) {
        uint x = tid + i * NT;
        rb[i] = x < RB * CB ? load_chunk_b(n0, k0, x) : uvec4(0);
      }
    }
    const uint as = stage * A_STAGE, bs = stage * B_STAGE;
    [[unroll]] for (uint kk = 0; kk < BK / 16u; ++kk) {
      DECL_AB;
      [[unroll]] for (uint i = 0; i < TM; ++i) { LOAD_A(i, as + a_elem((sgm * TM + i) * 16u, kk * 16u)); }
      [[unroll]] for (uint j = 0; j < TN; ++j) {
        LOAD_B(bs + b_elem(kk * 16u, (sgn * TN + j) * 16u));
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

  // Epilogue: each accumulator through the subgroup's 16x16 scratch tile, then per element.
  const uint cm = m0 + sgm * TM * 16u, cn = n0 + sgn * TN * 16u;
  [[unroll]] for (uint i = 0; i < TM; ++i) {
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      barrier();
      STORE_TILE(i * TN + j, sg * 256u);
      barrier();
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        const uint x = LANE + 32u * e;
        const uint m = cm + i * 16u + (x >> 4), n = cn + j * 16u + (x & 15u);
        if (m < pc.M && n < pc.N) {
          const uint ci = cbase + m * pc.ldc + n;
          float v = pc.alpha * Csh[sg * 256u + x];
          if (pc.beta != 0.0) v += pc.beta * C[ci];
          C[ci] = v;
        }
      }
    }
  }
}
