#version 450
// Fused causal GQA attention, FlashAttention-2 structure, on matrix cores (ops/flash_attention.h
// has the layouts, the mask and the host side). No [S, S] matrix exists anywhere: a workgroup
// keeps one tile of queries and one tile of keys in shared memory, the products run on
// GL_NV_cooperative_matrix 16x16x16 fp16 fragments with fp32 accumulation, and the softmax
// statistics stay fp32.
//
//   flash_fwd_*        one workgroup per (query tile of BR rows, head h, sequence), one subgroup
//                      per 16 query rows: over the key tiles of BC keys up to the causal limit,
//                      S = Q K^T (fragments), the online softmax (one thread per row, on S stored
//                      to shared memory; P is written as fp16 over S in place), O += P V (fragments
//                      kept in registers for the whole loop). Writes out and lse = m + log(l).
//                      (q, k, v, seg, out, lse)
//   flash_bwd_dq_*     one workgroup per (query tile, head, sequence): D_i = dout_i . out_i (fp32,
//                      also written for the dk/dv kernel), then over the key tiles S = Q K^T and
//                      dP = dout V^T (fragments), dS = P (dP - D) with P = exp(scale S - lse)
//                      (per element, as fp16 into shared memory), dq += dS K; dq = scale dq.
//                      (q, k, v, seg, out, lse, dout, dq, D)
//   flash_bwd_dkdv_*   one workgroup per (key tile of BC keys, kv head g, sequence), one subgroup
//                      per 16 keys: over the query heads of g and the query tiles at or after the
//                      key tile, S^T = K Q^T, dP^T = V dout^T, then dv += P^T dout and
//                      dk += dS^T q in registers; dk = scale dk. Summing the heads of g inside one
//                      workgroup makes GQA's reduction deterministic and needs no atomics.
//                      With pc.parts > 1 the query heads of g are split into that many
//                      workgroups (more parallelism where S/BC x nkv x B is small), each writing
//                      a partial dk, dv as kv head g * parts + part of [B*S, nkv * parts, d].
//                      (q, k, v, seg, lse, dout, D, dk, dv)
//   flash_sum_parts    dst [T, nkv, d] = the sum over p of src [T, nkv * parts, d] (the partial
//                      dk or dv), in a fixed order: deterministic. (src, dst; T = pc.seq)
// The dq kernel runs first (it writes D). Every tile pair with no visible (query, key) pair
// (beyond the causal limit, or other documents of a packed sequence) is skipped before its
// tiles are loaded.
//
// Forward softmax with lazy rescaling: a row's exponents use m, a running maximum that is raised
// only when a tile's maximum exceeds it by more than TAU (and then to that maximum), so P <=
// exp(TAU) fits fp16 and the O fragments, which coopmat v1 cannot scale row by row in registers,
// are rescaled through shared memory only on those (rare) tiles. out = O / l and
// lse = m + log(l) are exact whatever m is.
//
// Variants (the same tiling; tile sizes and head_dim are specialization constants):
//   _nvcm   GL_NV_cooperative_matrix (NVIDIA), fp16 operands, fp32 accumulation.
//   _emu    each cooperative-matrix operation replaced by scalar code that follows its
//           definition (as gemm_coopmat.comp's gemm_nvcm_emu), fp16 rounding included: runs the
//           tiling and addressing on any device, lavapipe included (CI).
//   _f32    the emulation with fp32 operands (no rounding): the same algorithm at fp32 accuracy.
//
// Shared memory is one uvec4 array with regions (offsets in uvec4 units): operand tiles (fp16,
// or fp32 in _f32) with rows of LDH = HD + EPU elements (one 16-byte pad against bank
// conflicts), fp32 score tiles, and 16x16 fp32 scratch tiles per subgroup through which the
// accumulators reach per-element code. fp16 values are rounded with round_to_f16 (RNE) before
// packHalf2x16, so the rounding is the same on every driver.
// A masked score never enters exp; lse of a row that sees nothing is stored as the bits of -inf.
//! variant flash_fwd_nvcm -DFWD requires=nv_coopmat
//! variant flash_fwd_emu -DFWD -DEMULATE
//! variant flash_fwd_f32 -DFWD -DEMULATE -DF32
//! variant flash_bwd_dq_nvcm -DBWD_DQ requires=nv_coopmat
//! variant flash_bwd_dq_emu -DBWD_DQ -DEMULATE
//! variant flash_bwd_dq_f32 -DBWD_DQ -DEMULATE -DF32
//! variant flash_bwd_dkdv_nvcm -DBWD_DKDV requires=nv_coopmat
//! variant flash_bwd_dkdv_emu -DBWD_DKDV -DEMULATE
//! variant flash_bwd_dkdv_f32 -DBWD_DKDV -DEMULATE -DF32
//! variant flash_sum_parts -DSUM_PARTS
#extension GL_EXT_control_flow_attributes : require
#if !defined(EMULATE) && !defined(SUM_PARTS)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
#include "f16_round.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BR = 64;   // query rows per tile (multiple of 16)
layout(constant_id = 2) const uint BC = 32;   // keys per tile (multiple of 16)
layout(constant_id = 3) const uint HD = 128;  // head_dim rounded up to a multiple of 16 (pc.head_dim: itself)

layout(push_constant) uniform PC {
  uint seq, n_heads, n_kv_heads, head_dim;
  float scale;
  // Element offsets into the bindings, in binding order (unused ones are 0).
  uint off0, off1, off2, off3, off4, off5, off6, off7, off8;
  uint parts;  // flash_bwd_dkdv, flash_sum_parts: partial sums over the query heads of a kv head
} pc;

#if defined(SUM_PARTS)
layout(set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { float dst[]; };

void main() {
  const uint total = pc.seq * pc.n_kv_heads * pc.head_dim;
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint e = gl_GlobalInvocationID.x; e < total; e += stride) {
    const uint c = e % pc.head_dim, tg = e / pc.head_dim;  // tg = token * nkv + g
    float acc = 0.0;
    for (uint p = 0u; p < pc.parts; ++p) acc += src[pc.off0 + (tg * pc.parts + p) * pc.head_dim + c];
    dst[pc.off1 + e] = acc;
  }
}
#else

#define NEG (-3.0e38)
#define NEG_INF_BITS 0xff800000u
#define TAU 8.0  // lazy rescaling threshold (natural log units): P <= e^8 ~ 2981

#if defined(FWD)
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { float k[]; };
layout(set = 0, binding = 2) readonly buffer V { float v[]; };
layout(set = 0, binding = 3) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 4) writeonly buffer Out { float o[]; };
layout(set = 0, binding = 5) writeonly buffer Lse { uint lse_bits[]; };
#define SEG_OFF pc.off3
#elif defined(BWD_DQ)
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { float k[]; };
layout(set = 0, binding = 2) readonly buffer V { float v[]; };
layout(set = 0, binding = 3) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 4) readonly buffer Out { float o[]; };
layout(set = 0, binding = 5) readonly buffer Lse { float lse[]; };
layout(set = 0, binding = 6) readonly buffer DOut { float dout[]; };
layout(set = 0, binding = 7) writeonly buffer DQ { float dq[]; };
layout(set = 0, binding = 8) writeonly buffer DRow { float drow[]; };
#define SEG_OFF pc.off3
#else
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { float k[]; };
layout(set = 0, binding = 2) readonly buffer V { float v[]; };
layout(set = 0, binding = 3) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 4) readonly buffer Lse { float lse[]; };
layout(set = 0, binding = 5) readonly buffer DOut { float dout[]; };
layout(set = 0, binding = 6) readonly buffer DRow { float drow[]; };
layout(set = 0, binding = 7) writeonly buffer DK { float dk[]; };
layout(set = 0, binding = 8) writeonly buffer DV { float dv[]; };
#define SEG_OFF pc.off3
#endif

// ---- shared memory layout ---------------------------------------------------------------------
#ifdef F32
const uint EPU = 4u;  // operand elements per uvec4
const uint EPW = 1u;  // operand elements per 32-bit word
#else
const uint EPU = 8u;
const uint EPW = 2u;
#endif
const uint HF = HD / 16u;          // 16-wide fragments across head_dim
const uint LDH = HD + EPU;         // row stride of the q/k/v/dout tiles (elements)
const uint SCR_TILE = 64u;         // one 16x16 fp32 scratch tile (uvec4)

#if defined(FWD)
const uint NT = (BR / 16u) * 32u;
const uint LDS = BC + 4u;          // score row stride (fp32 words); P (fp16) overwrites S in place
const uint LDP = LDS * EPW;        // P row stride (elements)
const uint Q_OFF = 0u;
const uint Q_SIZE = BR * LDH / EPU;
const uint KV_SIZE = BC * LDH / EPU;
const uint K_OFF = Q_SIZE;
const uint V_OFF = K_OFF + KV_SIZE;
const uint S_OFF = V_OFF + KV_SIZE;
const uint S_SIZE = BR * LDS / 4u;
// Rescale/epilogue scratch (one tile per subgroup): the K tile, dead once S is computed, when
// it is large enough; otherwise its own region.
const uint SCR_NEED = (BR / 16u) * SCR_TILE;
const uint SCR_OFF = KV_SIZE >= SCR_NEED ? K_OFF : S_OFF + S_SIZE;
const uint SH_SIZE = S_OFF + S_SIZE + (KV_SIZE >= SCR_NEED ? 0u : SCR_NEED);
#elif defined(BWD_DQ)
const uint NT = (BR / 16u) * 32u;
const uint LDD = BC + EPU;         // dS row stride (elements)
const uint Q_SIZE = BR * LDH / EPU;
const uint KV_SIZE = BC * LDH / EPU;
const uint Q_OFF = 0u;
const uint DO_OFF = Q_SIZE;
const uint K_OFF = 2u * Q_SIZE;
const uint V_OFF = K_OFF + KV_SIZE;
const uint DS_OFF = V_OFF + KV_SIZE;
const uint SCR_OFF = DS_OFF + BR * LDD / EPU;  // two scratch tiles per subgroup (S, dP)
const uint SH_SIZE = SCR_OFF + (BR / 16u) * 2u * SCR_TILE;
#else
const uint NT = (BC / 16u) * 32u;
const uint LDT = BR + EPU;         // P^T and dS^T row stride (elements)
const uint Q_SIZE = BR * LDH / EPU;
const uint KV_SIZE = BC * LDH / EPU;
const uint K_OFF = 0u;
const uint V_OFF = KV_SIZE;
const uint Q_OFF = 2u * KV_SIZE;
const uint DO_OFF = Q_OFF + Q_SIZE;
const uint PT_OFF = DO_OFF + Q_SIZE;
const uint DST_OFF = PT_OFF + BC * LDT / EPU;
const uint SCR_OFF = DST_OFF + BC * LDT / EPU;
const uint SH_SIZE = SCR_OFF + (BC / 16u) * 2u * SCR_TILE;
#endif

shared uvec4 sh[SH_SIZE];
shared int sseg_q[BR];
shared int sseg_k[BC];
shared uint sflag_any, sflag_rescale;
#if defined(FWD)
shared float srow_m[BR], srow_l[BR], srow_alpha[BR];
#else
shared float slse[BR], sd[BR];
#endif
#if defined(BWD_DQ)
shared float sred[NT];
#endif

// fp32 words and operand elements of sh.
float w_get(uint w) { return uintBitsToFloat(sh[w >> 2][w & 3u]); }
void w_put(uint w, float x) { sh[w >> 2][w & 3u] = floatBitsToUint(x); }
#ifdef F32
float op_get(uint e) { return w_get(e); }
void op_put2(uint e, float a, float b) {  // e even
  w_put(e, a);
  w_put(e + 1u, b);
}
#else
float op_get(uint e) { return unpackHalf2x16(sh[e >> 3][(e >> 1) & 3u])[e & 1u]; }
void op_put2(uint e, float a, float b) {  // e even: one 32-bit word
  sh[e >> 3][(e >> 1) & 3u] = packHalf2x16(vec2(round_to_f16(a), round_to_f16(b)));
}
#endif

// ---- fragments ----------------------------------------------------------------------------------
// Operand addresses are element indices into sh (E), row strides in elements (LD), CM = stored
// column-major (element (r, c) at E + c LD + r). Accumulator addresses are fp32 word indices.
#ifndef EMULATE
#define ACC_T fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define OPD_T fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define DECL_ACC(NAME, N) ACC_T NAME[N]
#define ZERO_ACC(NAME, I) NAME[I] = ACC_T(0.0)
#define DECL_A(NAME) OPD_T NAME
#define LOAD_A(NAME, E, LD, CM) coopMatLoadNV(NAME, sh, (E) / EPU, (LD) / EPU, CM)
#define MMA(ACC, I, A, E, LD, CM)                         \
  {                                                       \
    OPD_T b_;                                             \
    coopMatLoadNV(b_, sh, (E) / EPU, (LD) / EPU, CM);     \
    ACC[I] = coopMatMulAddNV(A, b_, ACC[I]);              \
  }
#define STORE_ACC(ACC, I, W, LDW) coopMatStoreNV(ACC[I], sh, (W) / 4u, (LDW) / 4u, false)
#define LOAD_ACC(ACC, I, W, LDW) coopMatLoadNV(ACC[I], sh, (W) / 4u, (LDW) / 4u, false)
#define LANE gl_SubgroupInvocationID
#define SUBGROUP gl_SubgroupID
#else
// Virtual subgroups of 32 consecutive invocations. An accumulator is spread over its lanes, 8
// elements each (element e of lane L is matrix index L + 32 e, row-major); an A operand is
// represented by its address and read from shared memory inside the product.
#define LANE (gl_LocalInvocationIndex % 32u)
#define SUBGROUP (gl_LocalInvocationIndex / 32u)
#define DECL_ACC(NAME, N) float NAME[(N) * 8u]
#define ZERO_ACC(NAME, I) for (uint e_ = 0u; e_ < 8u; ++e_) NAME[(I) * 8u + e_] = 0.0
#define DECL_A(NAME) uint NAME[3]
#define LOAD_A(NAME, E, LD, CM) \
  NAME[0] = (E);                \
  NAME[1] = (LD);               \
  NAME[2] = (CM) ? 1u : 0u
#define A_AT(A, R, KK) op_get(A[2] != 0u ? A[0] + (KK) * A[1] + (R) : A[0] + (R) * A[1] + (KK))
#define MMA(ACC, I, A, E, LD, CM)                                                             \
  for (uint e_ = 0u; e_ < 8u; ++e_) {                                                         \
    const uint x_ = LANE + 32u * e_, r_ = x_ >> 4, c_ = x_ & 15u;                             \
    float s_ = ACC[(I) * 8u + e_];                                                            \
    for (uint k_ = 0u; k_ < 16u; ++k_)                                                        \
      s_ += A_AT(A, r_, k_) * op_get((CM) ? (E) + c_ * (LD) + k_ : (E) + k_ * (LD) + c_);     \
    ACC[(I) * 8u + e_] = s_;                                                                  \
  }
#define STORE_ACC(ACC, I, W, LDW)                                           \
  for (uint e_ = 0u; e_ < 8u; ++e_) {                                       \
    const uint x_ = LANE + 32u * e_;                                        \
    w_put((W) + (x_ >> 4) * (LDW) + (x_ & 15u), ACC[(I) * 8u + e_]);        \
  }
#define LOAD_ACC(ACC, I, W, LDW)                                            \
  for (uint e_ = 0u; e_ < 8u; ++e_) {                                       \
    const uint x_ = LANE + 32u * e_;                                        \
    ACC[(I) * 8u + e_] = w_get((W) + (x_ >> 4) * (LDW) + (x_ & 15u));       \
  }
#endif

// Loops over fragments are unrolled for the cooperative-matrix kernels (accumulator arrays stay
// in registers); the emulation keeps them rolled: unrolled, its scalar products make shaders that
// take lavapipe minutes to compile.
#ifndef EMULATE
#define UNROLL [[unroll]]
#else
#define UNROLL [[dont_unroll]]
#endif

// ---- helpers ------------------------------------------------------------------------------------
uint token_row(uint b, uint i, uint heads, uint h) { return ((b * pc.seq + i) * heads + h) * pc.head_dim; }
uint stat_index(uint b, uint h, uint i) { return (b * pc.n_heads + h) * pc.seq + i; }
// Query i sees key j iff j <= i and seg[j] == seg[i] != 0; rows past the sequence carry segment 0.
bool visible(uint i, uint j, int seg_i, int seg_j) { return j <= i && seg_i != 0 && seg_j == seg_i; }

// Rows [ROW0, ROW0 + ROWS) of head HEAD of a token-major fp32 array into the operand tile at
// uvec4 offset REGION (row stride LDH), zero past the sequence and in the columns from head_dim
// to HD. A macro because GLSL cannot pass buffers by reference.
#define LOAD_TILE(REGION, ROWS, SRC, SRC_OFF, HEADS, B, ROW0, HEAD)                  \
  for (uint p_ = gl_LocalInvocationIndex; p_ < (ROWS) * (HD / 2u); p_ += NT) {       \
    const uint r_ = p_ / (HD / 2u), c_ = 2u * (p_ % (HD / 2u)), i_ = (ROW0) + r_;    \
    vec2 x_ = vec2(0.0);                                                             \
    if (i_ < pc.seq && c_ < pc.head_dim) {                                           \
      const uint s_ = (SRC_OFF) + token_row(B, i_, HEADS, HEAD) + c_;                \
      x_ = vec2(SRC[s_], c_ + 1u < pc.head_dim ? SRC[s_ + 1u] : 0.0);                \
    }                                                                                \
    op_put2((REGION) * EPU + r_ * LDH + c_, x_.x, x_.y);                             \
  }

// Segment ids of rows [ROW0, ROW0 + ROWS) of sequence B (0 past the sequence).
#define LOAD_SEG(DST, ROWS, B, ROW0)                                   \
  for (uint r_ = gl_LocalInvocationIndex; r_ < (ROWS); r_ += NT) {     \
    const uint i_ = (ROW0) + r_;                                       \
    DST[r_] = i_ < pc.seq ? seg[SEG_OFF + (B) * pc.seq + i_] : 0;      \
  }

// sflag_any = whether any (query, key) pair of the current tiles is visible (between barriers).
#define CHECK_ANY(Q0, K0)                                                                  \
  for (uint e_ = gl_LocalInvocationIndex; e_ < BR * BC; e_ += NT) {                        \
    const uint r_ = e_ / BC, c_ = e_ % BC;                                                 \
    if (visible((Q0) + r_, (K0) + c_, sseg_q[r_], sseg_k[c_])) sflag_any = 1u;             \
  }

void main() {
  const uint t = gl_LocalInvocationIndex;
  const uint sg = SUBGROUP, lane = LANE;
  const uint b = gl_WorkGroupID.z;
  const uint rep = pc.n_heads / pc.n_kv_heads;

#if defined(FWD)
  const uint q0 = gl_WorkGroupID.x * BR, h = gl_WorkGroupID.y, g = h / rep;
  LOAD_TILE(Q_OFF, BR, q, pc.off0, pc.n_heads, b, q0, h)
  LOAD_SEG(sseg_q, BR, b, q0)
  for (uint r = t; r < BR; r += NT) {
    srow_m[r] = NEG;
    srow_l[r] = 0.0;
  }
  DECL_ACC(acc_o, HF);
  UNROLL for (uint f = 0u; f < HF; ++f) { ZERO_ACC(acc_o, f); }
  bool o_started = false;  // uniform: whether any P V has been accumulated
  const uint scr = SCR_OFF * 4u + sg * 256u;  // this subgroup's scratch tile (words)

  const uint k_end = min(pc.seq, q0 + BR);  // causal: no query of the tile sees past it
  for (uint k0 = 0u; k0 < k_end; k0 += BC) {
    barrier();  // the previous tiles are no longer read
    LOAD_SEG(sseg_k, BC, b, k0)
    if (t == 0u) {
      sflag_any = 0u;
      sflag_rescale = 0u;
    }
    barrier();
    CHECK_ANY(q0, k0)
    barrier();
    if (sflag_any == 0u) continue;  // uniform
    LOAD_TILE(K_OFF, BC, k, pc.off1, pc.n_kv_heads, b, k0, g)
    LOAD_TILE(V_OFF, BC, v, pc.off2, pc.n_kv_heads, b, k0, g)
    barrier();
    {  // S = Q K^T, this subgroup's 16 rows
      DECL_ACC(acc_s, BC / 16u);
      UNROLL for (uint j = 0u; j < BC / 16u; ++j) { ZERO_ACC(acc_s, j); }
      UNROLL for (uint kk = 0u; kk < HF; ++kk) {
        DECL_A(qa);
        LOAD_A(qa, Q_OFF * EPU + sg * 16u * LDH + kk * 16u, LDH, false);
        UNROLL for (uint j = 0u; j < BC / 16u; ++j) {
          MMA(acc_s, j, qa, K_OFF * EPU + j * 16u * LDH + kk * 16u, LDH, true);
        }
      }
      UNROLL for (uint j = 0u; j < BC / 16u; ++j) { STORE_ACC(acc_s, j, S_OFF * 4u + sg * 16u * LDS + j * 16u, LDS); }
    }
    barrier();
    // Online softmax, one thread per row; P overwrites the row's S in place (word kj / EPW holds
    // P[kj] when S[kj / EPW] has been read).
    for (uint r = t; r < BR; r += NT) {
      const uint i = q0 + r;
      const int sq = sseg_q[r];
      const uint srow = S_OFF * 4u + r * LDS;
      float m_tile = NEG;
      for (uint kj = 0u; kj < BC; ++kj)
        if (visible(i, k0 + kj, sq, sseg_k[kj])) m_tile = max(m_tile, pc.scale * w_get(srow + kj));
      float m = srow_m[r], alpha = 1.0;
      if (m_tile > m + TAU) {
        alpha = m > 0.5 * NEG ? exp(m - m_tile) : 0.0;
        m = m_tile;
        srow_m[r] = m;
        sflag_rescale = 1u;
      }
      srow_alpha[r] = alpha;
      float l = srow_l[r] * alpha;
      for (uint kj = 0u; kj < BC; kj += 2u) {
        float p0 = 0.0, p1 = 0.0;
        if (visible(i, k0 + kj, sq, sseg_k[kj])) p0 = exp(pc.scale * w_get(srow + kj) - m);
        if (visible(i, k0 + kj + 1u, sq, sseg_k[kj + 1u])) p1 = exp(pc.scale * w_get(srow + kj + 1u) - m);
        l += p0 + p1;
        op_put2(srow * EPW + kj, p0, p1);
      }
      srow_l[r] = l;
    }
    barrier();
    if (sflag_rescale != 0u && o_started) {  // uniform; O rows *= alpha through the scratch tile
      UNROLL for (uint f = 0u; f < HF; ++f) {
        STORE_ACC(acc_o, f, scr, 16u);
        barrier();
        for (uint e = 0u; e < 8u; ++e) {
          const uint x = lane + 32u * e;
          w_put(scr + x, w_get(scr + x) * srow_alpha[sg * 16u + (x >> 4)]);
        }
        barrier();
        LOAD_ACC(acc_o, f, scr, 16u);
        barrier();
      }
    }
    o_started = true;
    // O += P V
    UNROLL for (uint kk = 0u; kk < BC / 16u; ++kk) {
      DECL_A(pa);
      LOAD_A(pa, S_OFF * EPU + sg * 16u * LDP + kk * 16u, LDP, false);
      UNROLL for (uint f = 0u; f < HF; ++f) { MMA(acc_o, f, pa, V_OFF * EPU + kk * 16u * LDH + f * 16u, LDH, false); }
    }
  }
  barrier();
  // out = O / l (0 for a row that saw nothing), through the scratch tile.
  UNROLL for (uint f = 0u; f < HF; ++f) {
    STORE_ACC(acc_o, f, scr, 16u);
    barrier();
    for (uint e = 0u; e < 8u; ++e) {
      const uint x = lane + 32u * e, r = sg * 16u + (x >> 4), i = q0 + r;
      const uint c = f * 16u + (x & 15u);
      if (i < pc.seq && c < pc.head_dim) {
        const float l = srow_l[r];
        o[pc.off4 + token_row(b, i, pc.n_heads, h) + c] = l > 0.0 ? w_get(scr + x) / l : 0.0;
      }
    }
    barrier();
  }
  for (uint r = t; r < BR; r += NT) {
    const uint i = q0 + r;
    const float l = srow_l[r];
    if (i < pc.seq) lse_bits[pc.off5 + stat_index(b, h, i)] = l > 0.0 ? floatBitsToUint(srow_m[r] + log(l)) : NEG_INF_BITS;
  }

#elif defined(BWD_DQ)
  const uint q0 = gl_WorkGroupID.x * BR, h = gl_WorkGroupID.y, g = h / rep;
  LOAD_TILE(Q_OFF, BR, q, pc.off0, pc.n_heads, b, q0, h)
  LOAD_TILE(DO_OFF, BR, dout, pc.off6, pc.n_heads, b, q0, h)
  LOAD_SEG(sseg_q, BR, b, q0)
  // D_i = dout_i . out_i in fp32 from the unrounded values: NT = 2 BR threads, two per row.
  {
    const uint r = t % BR, half_ = t / BR, i = q0 + r;
    float part = 0.0;
    if (i < pc.seq) {
      const uint base = token_row(b, i, pc.n_heads, h);
      for (uint c = half_ * (HD / 2u); c < min((half_ + 1u) * (HD / 2u), pc.head_dim); ++c)
        part += dout[pc.off6 + base + c] * o[pc.off4 + base + c];
    }
    sred[t] = part;
  }
  barrier();
  for (uint r = t; r < BR; r += NT) {
    const uint i = q0 + r;
    const float d_i = sred[r] + sred[r + BR];
    sd[r] = d_i;
    slse[r] = i < pc.seq ? lse[pc.off5 + stat_index(b, h, i)] : 0.0;
    if (i < pc.seq) drow[pc.off8 + stat_index(b, h, i)] = d_i;
  }
  DECL_ACC(acc_dq, HF);
  UNROLL for (uint f = 0u; f < HF; ++f) { ZERO_ACC(acc_dq, f); }
  const uint scr = SCR_OFF * 4u + sg * 512u;  // this subgroup's two scratch tiles (words)

  const uint k_end = min(pc.seq, q0 + BR);
  for (uint k0 = 0u; k0 < k_end; k0 += BC) {
    barrier();
    LOAD_SEG(sseg_k, BC, b, k0)
    if (t == 0u) sflag_any = 0u;
    barrier();
    CHECK_ANY(q0, k0)
    barrier();
    if (sflag_any == 0u) continue;
    LOAD_TILE(K_OFF, BC, k, pc.off1, pc.n_kv_heads, b, k0, g)
    LOAD_TILE(V_OFF, BC, v, pc.off2, pc.n_kv_heads, b, k0, g)
    barrier();
    UNROLL for (uint j = 0u; j < BC / 16u; ++j) {
      DECL_ACC(acc_sp, 2);  // S, dP of keys j*16 ..
      ZERO_ACC(acc_sp, 0);
      ZERO_ACC(acc_sp, 1);
      UNROLL for (uint kk = 0u; kk < HF; ++kk) {
        DECL_A(a);
        LOAD_A(a, Q_OFF * EPU + sg * 16u * LDH + kk * 16u, LDH, false);
        MMA(acc_sp, 0, a, K_OFF * EPU + j * 16u * LDH + kk * 16u, LDH, true);
        LOAD_A(a, DO_OFF * EPU + sg * 16u * LDH + kk * 16u, LDH, false);
        MMA(acc_sp, 1, a, V_OFF * EPU + j * 16u * LDH + kk * 16u, LDH, true);
      }
      STORE_ACC(acc_sp, 0, scr, 16u);
      STORE_ACC(acc_sp, 1, scr + 256u, 16u);
      barrier();
      // dS = P (dP - D), P = exp(scale S - lse); two adjacent keys per step (one fp16 word).
      for (uint e = 0u; e < 4u; ++e) {
        const uint x = 2u * (lane + 32u * e), r = sg * 16u + (x >> 4), c = j * 16u + (x & 15u), i = q0 + r;
        float ds[2];
        UNROLL for (uint u = 0u; u < 2u; ++u) {
          ds[u] = 0.0;
          if (visible(i, k0 + c + u, sseg_q[r], sseg_k[c + u])) {
            const float p = exp(pc.scale * w_get(scr + x + u) - slse[r]);
            ds[u] = p * (w_get(scr + 256u + x + u) - sd[r]);
          }
        }
        op_put2(DS_OFF * EPU + r * LDD + c, ds[0], ds[1]);
      }
      barrier();
    }
    // dq += dS K
    UNROLL for (uint kk = 0u; kk < BC / 16u; ++kk) {
      DECL_A(a);
      LOAD_A(a, DS_OFF * EPU + sg * 16u * LDD + kk * 16u, LDD, false);
      UNROLL for (uint f = 0u; f < HF; ++f) { MMA(acc_dq, f, a, K_OFF * EPU + kk * 16u * LDH + f * 16u, LDH, false); }
    }
  }
  barrier();
  UNROLL for (uint f = 0u; f < HF; ++f) {
    STORE_ACC(acc_dq, f, scr, 16u);
    barrier();
    for (uint e = 0u; e < 8u; ++e) {
      const uint x = lane + 32u * e, r = sg * 16u + (x >> 4), i = q0 + r, c = f * 16u + (x & 15u);
      if (i < pc.seq && c < pc.head_dim) dq[pc.off7 + token_row(b, i, pc.n_heads, h) + c] = pc.scale * w_get(scr + x);
    }
    barrier();
  }

#else  // BWD_DKDV
  const uint parts = max(pc.parts, 1u), heads = rep / parts;  // query heads per workgroup
  const uint k0 = gl_WorkGroupID.x * BC, g = gl_WorkGroupID.y / parts, part = gl_WorkGroupID.y % parts;
  LOAD_TILE(K_OFF, BC, k, pc.off1, pc.n_kv_heads, b, k0, g)
  LOAD_TILE(V_OFF, BC, v, pc.off2, pc.n_kv_heads, b, k0, g)
  LOAD_SEG(sseg_k, BC, b, k0)
  DECL_ACC(acc_dk, HF);
  DECL_ACC(acc_dv, HF);
  UNROLL for (uint f = 0u; f < HF; ++f) {
    ZERO_ACC(acc_dk, f);
    ZERO_ACC(acc_dv, f);
  }
  const uint scr = SCR_OFF * 4u + sg * 512u;
  const uint q_start = k0 / BR * BR;  // causal: the first query tile that can see the key tile
  for (uint h = g * rep + part * heads; h < g * rep + (part + 1u) * heads; ++h) {
    for (uint q0 = q_start; q0 < pc.seq; q0 += BR) {
      barrier();
      LOAD_SEG(sseg_q, BR, b, q0)
      for (uint r = t; r < BR; r += NT) {
        const uint i = q0 + r;
        slse[r] = i < pc.seq ? lse[pc.off4 + stat_index(b, h, i)] : 0.0;
        sd[r] = i < pc.seq ? drow[pc.off6 + stat_index(b, h, i)] : 0.0;
      }
      if (t == 0u) sflag_any = 0u;
      barrier();
      CHECK_ANY(q0, k0)
      barrier();
      if (sflag_any == 0u) continue;
      LOAD_TILE(Q_OFF, BR, q, pc.off0, pc.n_heads, b, q0, h)
      LOAD_TILE(DO_OFF, BR, dout, pc.off5, pc.n_heads, b, q0, h)
      barrier();
      UNROLL for (uint j = 0u; j < BR / 16u; ++j) {
        DECL_ACC(acc_sp, 2);  // S^T, dP^T of this subgroup's 16 keys x queries j*16 ..
        ZERO_ACC(acc_sp, 0);
        ZERO_ACC(acc_sp, 1);
        UNROLL for (uint kk = 0u; kk < HF; ++kk) {
          DECL_A(a);
          LOAD_A(a, K_OFF * EPU + sg * 16u * LDH + kk * 16u, LDH, false);
          MMA(acc_sp, 0, a, Q_OFF * EPU + j * 16u * LDH + kk * 16u, LDH, true);
          LOAD_A(a, V_OFF * EPU + sg * 16u * LDH + kk * 16u, LDH, false);
          MMA(acc_sp, 1, a, DO_OFF * EPU + j * 16u * LDH + kk * 16u, LDH, true);
        }
        STORE_ACC(acc_sp, 0, scr, 16u);
        STORE_ACC(acc_sp, 1, scr + 256u, 16u);
        barrier();
        // P^T and dS^T; two adjacent queries per step.
        for (uint e = 0u; e < 4u; ++e) {
          const uint x = 2u * (lane + 32u * e), kr = sg * 16u + (x >> 4), qr = j * 16u + (x & 15u);
          float p[2], ds[2];
          UNROLL for (uint u = 0u; u < 2u; ++u) {
            p[u] = 0.0;
            ds[u] = 0.0;
            if (visible(q0 + qr + u, k0 + kr, sseg_q[qr + u], sseg_k[kr])) {
              p[u] = exp(pc.scale * w_get(scr + x + u) - slse[qr + u]);
              ds[u] = p[u] * (w_get(scr + 256u + x + u) - sd[qr + u]);
            }
          }
          op_put2(PT_OFF * EPU + kr * LDT + qr, p[0], p[1]);
          op_put2(DST_OFF * EPU + kr * LDT + qr, ds[0], ds[1]);
        }
        barrier();
      }
      // dv += P^T dout, dk += dS^T q
      UNROLL for (uint kk = 0u; kk < BR / 16u; ++kk) {
        DECL_A(a);
        LOAD_A(a, PT_OFF * EPU + sg * 16u * LDT + kk * 16u, LDT, false);
        UNROLL for (uint f = 0u; f < HF; ++f) { MMA(acc_dv, f, a, DO_OFF * EPU + kk * 16u * LDH + f * 16u, LDH, false); }
        LOAD_A(a, DST_OFF * EPU + sg * 16u * LDT + kk * 16u, LDT, false);
        UNROLL for (uint f = 0u; f < HF; ++f) { MMA(acc_dk, f, a, Q_OFF * EPU + kk * 16u * LDH + f * 16u, LDH, false); }
      }
    }
  }
  barrier();
  UNROLL for (uint f = 0u; f < HF; ++f) {
    STORE_ACC(acc_dk, f, scr, 16u);
    STORE_ACC(acc_dv, f, scr + 256u, 16u);
    barrier();
    for (uint e = 0u; e < 8u; ++e) {
      const uint x = lane + 32u * e, kr = sg * 16u + (x >> 4), jj = k0 + kr, c = f * 16u + (x & 15u);
      if (jj < pc.seq && c < pc.head_dim) {
        const uint dst = token_row(b, jj, pc.n_kv_heads * parts, g * parts + part) + c;
        dk[pc.off7 + dst] = pc.scale * w_get(scr + x);
        dv[pc.off8 + dst] = w_get(scr + 256u + x);
      }
    }
    barrier();
  }
#endif
}
#endif  // !SUM_PARTS
