#version 450
// The attention backward of mixed precision fused into two kernels (ops/attention_gemm.h: the
// GEMM path's backward where AttentionGemmOptions::fused_backward asks for it), the companion of
// flash_forward_khr.comp: the same subgroup-scope cooperative matrices (GL_KHR_cooperative_matrix,
// 16x16x16 fp16 with fp32 accumulation), the same accumulator lane pattern (ROW_SHIFT and
// COL_SHIFT from the host's probe), the same conversion of accumulators into A fragments
// (GL_NV_cooperative_matrix2). FlashAttention-2 structure: P is recomputed from q, k and the
// forward's lse per tile and never stored; dS = P (dP - D) with D = rowsum(dout * out) made
// beforehand (attention_row_dot.comp).
//
//   DQ   one workgroup per (BR = 16 x WARPS query rows, head, sequence); each subgroup holds its
//        16 rows of q and dout as A fragments and dq as accumulators; per key tile of BC keys (K
//        and V staged in shared memory): S = q K^T, dP = dout V^T, dS in registers, dq += dS K.
//   DKV  one workgroup per (BK = 16 x WARPS keys, kv head, sequence); keys are the rows: each
//        subgroup holds its 16 keys of k as A fragments (v's are read from shared memory) and dk
//        and dv as accumulators; for every query head of the kv head and every query tile of BQ
//        rows (q, dout, lse and D staged): S^T = k Q^T, dP^T = v dout^T, P^T and dS^T in
//        registers, dv += P^T dout, dk += dS^T Q. One pass computes P for both (separate dk and
//        dv kernels recomputed it twice: 8 products per visible pair in all, now 7). The query
//        heads of a kv head are summed here (GQA), so nothing is written twice and no atomics
//        are needed. Where that gives too few workgroups (one sequence, short ones), `split`
//        workgroups share a kv head's query heads, each writing its partial dk and dv
//        part_stride elements after the previous one's; the host sums them.
// Every reduction runs along the product's K dimension (keys for dq, queries for dk and dv), so
// no lane exchanges anything outside the cooperative-matrix products.
//
// Mask as the forward: query i sees key j iff j <= i and seg[j] == seg[i] != 0; tiles with no
// visible pair are skipped; masked pairs get P = 0 exactly. Scores are in log2 units (scale *
// log2(e) folded in, exp2 against lse * log2(e)). dq, dk, dv are written (=), times scale, fp32
// [tokens, heads, d]; rows past the sequence are not written.
//
// Specialization constants: 0 workgroup size (32 x WARPS), 1 WARPS, 2 BT (BC keys per tile for
// DQ; BQ queries per tile for DKV), 3 HD (= head_dim, a multiple of 16 up to 128), 4
// ROW_SHIFT, 5 COL_SHIFT (the accumulator's element order, as flash_forward_khr.comp), 6 PAIRED
// (each workgroup takes two row tiles, as the forward's). The _emu
// variants: the same without cooperative matrices (flash_khr_common.glsl), WARPS 1.
//
// dS through memory (the _ds variants, AttentionGemmOptions::dq_from_ds): the DKV kernel also
// writes dS (fp16, as the products read it) for every pair it visits, and DQ then reads it
// instead of recomputing S, dP and dS: 5 products per visible pair instead of 7, for a write and
// a read of S^2 / 2 halves per head. dS of one (sequence, query head) is kept by blocks of G =
// max(keys, queries of the DKV kernel's tiles) queries, block t's rows holding keys [0, (t + 1) G)
// (ds_row): every pair the DKV kernel visits falls inside, the causal half of the matrix and a
// little. DQ reads a pair only where the DKV kernel visited it (the same segment ranges decide),
// and the DKV kernel writes zeros for the fragments of a visited pair it skips (keys after all
// of the tile's queries).
//! variant flash_bwd_dq_khr -DDQ requires=nv_coopmat2
//! variant flash_bwd_dkv_khr -DDKV requires=nv_coopmat2
//! variant flash_bwd_dq_khr_emu -DDQ -DEMULATE
//! variant flash_bwd_dkv_khr_emu -DDKV -DEMULATE
//! variant flash_bwd_dq_ds_khr -DDQ -DFROM_DS requires=nv_coopmat2
//! variant flash_bwd_dkv_ds_khr -DDKV -DSTORE_DS requires=nv_coopmat2
//! variant flash_bwd_dq_ds_khr_emu -DDQ -DFROM_DS -DEMULATE
//! variant flash_bwd_dkv_ds_khr_emu -DDKV -DSTORE_DS -DEMULATE
//! variant flash_bwd_dq_ds_quad_khr -DDQ -DFROM_DS -DQUAD requires=nv_coopmat2
//! variant flash_bwd_dq_ds_quad_khr_emu -DDQ -DFROM_DS -DQUAD -DEMULATE
#extension GL_GOOGLE_include_directive : enable
#include "flash_khr_extensions.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint WARPS = 8;
layout(constant_id = 2) const uint BT = 32;
layout(constant_id = 3) const uint HD = 128;
layout(constant_id = 4) const uint ROW_SHIFT = 2;
layout(constant_id = 5) const uint COL_SHIFT = 1;
// Whether workgroup w computes row tiles w and n - 1 - w (grid of ceil(n / 2)) instead of tile w
// alone: the causal mask gives the dq tiles work growing with w and the dk/dv tiles work shrinking
// with w, so the pairs all cost the same (flash_forward_khr.comp's PAIRED).
layout(constant_id = 6) const bool PAIRED = false;
// The _ds variants: the DKV kernel's query tile (the DQ kernel's key tile BT is the DKV kernel's
// keys per workgroup).
layout(constant_id = 7) const uint DS_QUERIES = 32;

layout(push_constant) uniform PC {
  uint seq, n_heads, n_kv_heads, head_dim;
  float scale;
  uint seg_off, lse_off, drow_off, out_off, dv_off;  // element offsets in their bindings (dv_off: DKV)
  uint split, part_stride;  // DKV: workgroups per kv head, each writing its sums part_stride further
} pc;

// fp16 copies [tokens, heads, d] (ops::to_f16_block), 8 halves per uvec4, from their start.
layout(set = 0, binding = 0) readonly buffer Q { uvec4 q8[]; };
layout(set = 0, binding = 1) readonly buffer K { uvec4 k8[]; };
layout(set = 0, binding = 2) readonly buffer V { uvec4 v8[]; };
layout(set = 0, binding = 3) readonly buffer DO { uvec4 do8[]; };
layout(set = 0, binding = 4) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 5) readonly buffer Lse { float lse[]; };   // [B, nh, S], natural log
layout(set = 0, binding = 6) readonly buffer Drow { float drow[]; };  // [B, nh, S], rowsum(dout * out)
layout(set = 0, binding = 7) writeonly buffer Out { float o[]; };    // dq or dk
#if defined(DKV)
layout(set = 0, binding = 8) writeonly buffer Out2 { float o2[]; };  // dv
#endif
#if defined(FROM_DS)
layout(set = 0, binding = 8) readonly buffer DS { uvec4 ds8[]; };  // dS fp16, 8 halves per uvec4
#elif defined(STORE_DS) && defined(EMULATE)
layout(set = 0, binding = 9) writeonly buffer DS { uint ds2[]; };  // dS fp16, 2 halves per uint
#elif defined(STORE_DS)
layout(set = 0, binding = 9) writeonly buffer DS { uvec4 ds8[]; };
#endif

#define LOG2E 1.4426950408889634

const uint NT = 32u * WARPS;
const uint ROWS = 16u * WARPS;  // the workgroup's rows: queries (DQ) or keys (DK, DV)
const uint HF = HD / 16u;       // fragments across head_dim
const uint NF = BT / 16u;       // fragments across a tile
const uint CH = HD / 8u;        // uvec4 chunks (8 halves) per staged row
const uint LD = CH + 1u;        // staged row stride in uvec4: one chunk of padding against bank conflicts
const uint TILE = BT * LD;
#if defined(FROM_DS)
const uint DLD = BT / 8u + 1u;  // staged dS row stride in uvec4
const uint DS_AT = TILE;        // the workgroup's rows of dS for the key tile, after K
const uint SH_SIZE = TILE + ROWS * DLD;
#elif defined(DQ)
const uint OWN = 0u;  // the workgroup's own rows are staged before the loop, where the tiles go
const uint SH_SIZE = 2u * TILE > ROWS * LD ? 2u * TILE : ROWS * LD;
#else
const uint OWN = 2u * TILE;  // the workgroup's own rows of v stay there through the loop
const uint SH_SIZE = 2u * TILE + ROWS * LD;
#endif

shared uvec4 sh[SH_SIZE];  // two tiles at 0 and TILE, the workgroup's own rows at OWN
shared int sseg[BT];       // the tile's segment ids
#if defined(DKV)
shared float slse[BT];  // the query tile's lse * log2(e)
shared float sdrow[BT];  // and its D
#endif

#include "flash_khr_common.glsl"

// dS's block of queries: the larger of the DKV kernel's keys per workgroup and its query tile
// (in DQ those are BT and DS_QUERIES, in DKV ROWS and BT).
#if defined(FROM_DS)
const uint G = BT > DS_QUERIES ? BT : DS_QUERIES;
#elif defined(STORE_DS)
const uint G = ROWS > BT ? ROWS : BT;
#endif
#if defined(FROM_DS) || defined(STORE_DS)
// dS of one (sequence, query head): the halves it takes, and the start of query q's row (which
// holds keys [0, ds_row_len(q))).
uint ds_head_size() {
  const uint t = (pc.seq + G - 1u) / G;
  return G * G * (t * (t + 1u) / 2u);
}
uint ds_row_len(uint q) { return (q / G + 1u) * G; }
uint ds_row(uint q) {
  const uint t = q / G;
  return G * G * (t * (t + 1u) / 2u) + (q % G) * (t + 1u) * G;
}
#endif
#if defined(STORE_DS) && defined(EMULATE)
// The 16x16 fp16 matrix m (this lane's elements) written column-major at ds halves [at...], columns
// ld halves apart (at and ld even): through shared memory, two halves of a column per uint.
void emu_store_ds(float[8] m, uint at, uint ld) {
  for (uint i = 0u; i < 8u; ++i) emu_a[EMU + lane_row(LANE, i) * 16u + lane_col(LANE, i)] = m[i];
  barrier();
  for (uint u = LANE; u < 128u; u += 32u) {
    const uint c = u / 8u, r = 2u * (u % 8u);
    ds2[(at + c * ld) / 2u + u % 8u] = packHalf2x16(vec2(emu_a[EMU + r * 16u + c], emu_a[EMU + (r + 1u) * 16u + c]));
  }
  barrier();
}
#define STORE_DS_FRAG(m, at, ld) emu_store_ds(m, at, ld)
#elif defined(STORE_DS)
#define STORE_DS_FRAG(m, at, ld) coopMatStore(m, ds8, (at) / 8u, (ld) / 8u, COL_MAJOR)
#endif

#if defined(FROM_DS)
// The prefetch of dq from dS: this invocation's chunks of a key tile's K rows (PK) and of the
// workgroup's dS rows for those keys (PD), loaded into registers while the previous tile is
// computed and stored to shared memory after it. dS is zero past the sequence (whose rows it may
// not hold) and where a row's block ends before these keys.
const uint PK = (BT * CH + NT - 1u) / NT;
const uint PD = (ROWS * (BT / 8u) + NT - 1u) / NT;
void fetch_dq(uint c0, uint r0, uint k_first, uint ld, uint ds_head, out uvec4 pk[PK], out uvec4 pd[PD]) {
  UNROLL for (uint i = 0u; i < PK; ++i) {
    const uint x = gl_LocalInvocationIndex + i * NT, r = x / CH, c = x % CH;
    pk[i] = x < BT * CH && c0 + r < pc.seq ? k8[(k_first + (c0 + r) * ld) / 8u + c] : uvec4(0u);
  }
  UNROLL for (uint i = 0u; i < PD; ++i) {
    const uint x = gl_LocalInvocationIndex + i * NT, r = x / (BT / 8u), c = x % (BT / 8u), qi = r0 + r;
    const bool held = x < ROWS * (BT / 8u) && qi < pc.seq && c0 + BT <= ds_row_len(qi);
    pd[i] = held ? ds8[(ds_head + ds_row(qi) + c0) / 8u + c] : uvec4(0u);
  }
}
void put_dq(const uvec4 pk[PK], const uvec4 pd[PD]) {
  UNROLL for (uint i = 0u; i < PK; ++i) {
    const uint x = gl_LocalInvocationIndex + i * NT;
    if (x < BT * CH) sh[(x / CH) * LD + x % CH] = pk[i];
  }
  UNROLL for (uint i = 0u; i < PD; ++i) {
    const uint x = gl_LocalInvocationIndex + i * NT;
    if (x < ROWS * (BT / 8u)) sh[DS_AT + (x / (BT / 8u)) * DLD + x % (BT / 8u)] = pd[i];
  }
}
#endif

// Row tile wt (queries for DQ, keys for DKV) of gl_WorkGroupID.y's head(s), sequence
// gl_WorkGroupID.z.
void row_tile(const uint wt) {
  const uint b = gl_WorkGroupID.z;
  const uint warp = WARP, lane = LANE;
  const uint nh = pc.n_heads, nkv = pc.n_kv_heads, d = pc.head_dim, rep = nh / nkv;
  const uint tok0 = b * pc.seq, sbase = pc.seg_off + tok0;
  const float s2 = pc.scale * float(LOG2E);
  const uint r0 = wt * ROWS, rw = r0 + warp * 16u;  // the workgroup's and the subgroup's first row
  // This lane's two rows (the accumulator layout): rw + lane/4 and that + 8.
  const uint row[2] = {rw + (lane >> 2u), rw + (lane >> 2u) + 8u};
  int rseg[2];
  UNROLL for (uint hh = 0u; hh < 2u; ++hh) rseg[hh] = row[hh] < pc.seq ? seg[sbase + row[hh]] : 0;
  int rlo, rhi;
  bool rgap;
  segment_range(sbase, r0, ROWS, rlo, rhi, rgap);

  FRAG_C acc[HF];
  UNROLL for (uint f = 0u; f < HF; ++f) acc[f] = C_ZERO;

#if defined(FROM_DS)
  // ---- dq from the dS the DKV kernel wrote: rows are queries of head h. Each subgroup computes
  // rows qr... by all of head_dim; with QUAD the subgroups are 2 x 2: 32 rows by half of head_dim
  // (fragments cf...), so a fragment of dS or K loaded serves two products, where the other
  // layout loads one fragment per product (QUAD needs DS_QUERIES >= 32 and HD a multiple of 32:
  // the 32 rows lie in one query tile of the DKV kernel and one block of dS) -----------------------
  const uint h = gl_WorkGroupID.y, g = h / rep;
  const uint k_first = (tok0 * nkv + g) * d;
  const uint ds_head = (b * nh + h) * ds_head_size();
#if defined(QUAD)
  const uint qw = (warp >> 1u) * 32u, qn = 32u, cf = (warp & 1u) * (HF / 2u);
#else
  const uint qw = warp * 16u, qn = 16u;
#endif
  const uint qr = r0 + qw;  // the subgroup's first row (qn rows)
  // The DKV kernel's query tile that holds this subgroup's rows, and its segment range.
  int tlo, thi;
  bool tgap;
  segment_range(sbase, qr / DS_QUERIES * DS_QUERIES, DS_QUERIES, tlo, thi, tgap);
  const uint r_end = min(pc.seq, r0 + ROWS);
  const uint tiles = (r_end + BT - 1u) / BT;
  // The visible key tiles in turn, the next one's K and dS in flight while this one is computed:
  // a tile is one product per subgroup, too short to wait for its own loads.
  int nlo, nhi;
  bool ngap;
  uvec4 pk[PK], pd[PD];
  uint jn = next_visible_tile(0u, tiles, BT, sbase, rlo, rhi, nlo, nhi, ngap);
  if (jn < tiles) fetch_dq(jn * BT, r0, k_first, nkv * d, ds_head, pk, pd);
  while (jn < tiles) {
    const uint c0 = jn * BT;  // the key tile's first key: the DKV kernel's workgroup tile
    const int clo = nlo, chi = nhi;
    barrier();  // every subgroup is done with the previous tile
    put_dq(pk, pd);
    barrier();
    jn = next_visible_tile(jn + 1u, tiles, BT, sbase, rlo, rhi, nlo, nhi, ngap);
    if (jn < tiles) fetch_dq(jn * BT, r0, k_first, nkv * d, ds_head, pk, pd);
    // Every key of the tile after the subgroup's last row, or a pair the DKV kernel skipped (its
    // dS is not there): nothing to add. QUAD's emulation, whose products are its workgroup's
    // together, multiplies zeros instead.
    const bool none = c0 > qr + qn - 1u || chi < tlo || clo > thi;
#if !defined(EMULATE) || !defined(QUAD)
    if (none) continue;
#endif
#if defined(QUAD)
    // acc[m * HF / 2 + f]: row fragment m, d fragment cf + f
    UNROLL for (uint n = 0u; n < NF; ++n) {
      FRAG_A dsa[2];
      UNROLL for (uint m = 0u; m < 2u; ++m) {
        LOAD_LD(dsa[m], DS_AT + (qw + 16u * m) * DLD + 2u * n, DLD, ROW_MAJOR);
#if defined(EMULATE)
        if (none) dsa[m] = A_ZERO;
#endif
      }
      UNROLL for (uint f = 0u; f < HF / 2u; ++f) {
        FRAG_B kb;
        LOAD(kb, n * 16u * LD + 2u * (cf + f), ROW_MAJOR);
        UNROLL for (uint m = 0u; m < 2u; ++m) acc[m * (HF / 2u) + f] = MMA(dsa[m], kb, acc[m * (HF / 2u) + f]);
      }
    }
#else
    FRAG_A dsa[NF];
    UNROLL for (uint n = 0u; n < NF; ++n) LOAD_LD(dsa[n], DS_AT + qw * DLD + 2u * n, DLD, ROW_MAJOR);
    UNROLL for (uint f = 0u; f < HF; ++f) {
      UNROLL for (uint n = 0u; n < NF; ++n) {
        FRAG_B kb;
        LOAD(kb, n * 16u * LD + 2u * f, ROW_MAJOR);
        acc[f] = MMA(dsa[n], kb, acc[f]);
      }
    }
#endif
  }
  const uint out_first = pc.out_off + (tok0 * nh + h) * d, out_ld = nh * d;
#if defined(QUAD)
  UNROLL for (uint m = 0u; m < 2u; ++m) {
    UNROLL for (uint f = 0u; f < HF / 2u; ++f) {
      UNROLL for (uint i = 0u; i < 8u; ++i) {
        const uint q = qr + 16u * m + lane_row(lane, i);
        if (q < pc.seq)
          o[out_first + q * out_ld + (cf + f) * 16u + lane_col(lane, i)] = acc[m * (HF / 2u) + f][i] * pc.scale;
      }
    }
  }
  return;  // its rows and columns are not the layout the common write below assumes
#endif

#elif defined(DQ)
  // ---- dq: rows are queries of head h -------------------------------------------------------
  const uint h = gl_WorkGroupID.y, g = h / rep;
  const uint q_first = (tok0 * nh + h) * d, k_first = (tok0 * nkv + g) * d;
  const uint stat = (b * nh + h) * pc.seq;
  FRAG_A qa[HF], da[HF];
  STAGE(q8, 0u, r0, ROWS, q_first, nh * d);
  barrier();
  UNROLL for (uint k = 0u; k < HF; ++k)
    LOAD(qa[k], warp * 16u * LD + 2u * k, ROW_MAJOR);
  barrier();
  STAGE(do8, 0u, r0, ROWS, q_first, nh * d);
  barrier();
  UNROLL for (uint k = 0u; k < HF; ++k)
    LOAD(da[k], warp * 16u * LD + 2u * k, ROW_MAJOR);
  float lse2[2], dd[2];
  UNROLL for (uint hh = 0u; hh < 2u; ++hh) {
    const bool inside = row[hh] < pc.seq;
    lse2[hh] = inside ? lse[pc.lse_off + stat + row[hh]] * float(LOG2E) : 0.0;
    dd[hh] = inside ? drow[pc.drow_off + stat + row[hh]] : 0.0;
  }

  const uint r_end = min(pc.seq, r0 + ROWS);
  const uint tiles = (r_end + BT - 1u) / BT;
  for (uint j = 0u; j < tiles; ++j) {
    const uint c0 = j * BT;  // the key tile's first key
    int clo, chi;
    bool cgap;
    segment_range(sbase, c0, BT, clo, chi, cgap);
    if (chi < rlo || clo > rhi) continue;  // no visible pair (the same decision in every subgroup)
    barrier();                             // every subgroup is done with the previous tile
    STAGE(k8, 0u, c0, BT, k_first, nkv * d);
    STAGE(v8, TILE, c0, BT, k_first, nkv * d);
    for (uint c = gl_LocalInvocationIndex; c < BT; c += NT) sseg[c] = c0 + c < pc.seq ? seg[sbase + c0 + c] : 0;
    barrier();
    if (c0 > rw + 15u) continue;  // every key of the tile is after this subgroup's last query
    const bool full = !rgap && !cgap && rlo == rhi && clo == chi && rlo == clo && c0 + BT <= rw + 1u;

    // S = q K^T and dP = dout V^T: K and V are staged [key][d], so K^T and V^T are their
    // column-major readings.
    FRAG_C s[NF], dp[NF];
    UNROLL for (uint n = 0u; n < NF; ++n) {
      s[n] = C_ZERO;
      dp[n] = C_ZERO;
      UNROLL for (uint k = 0u; k < HF; ++k) {
        FRAG_B kb, vb;
        LOAD(kb, n * 16u * LD + 2u * k, COL_MAJOR);
        LOAD(vb, TILE + n * 16u * LD + 2u * k, COL_MAJOR);
        s[n] = MMA(qa[k], kb, s[n]);
        dp[n] = MMA(da[k], vb, dp[n]);
      }
    }
    // dS = P (dP - D), P = exp2(S s2 - lse2) on this lane's elements, 0 where masked; the masked
    // form only where some pair is not visible (one branch per tile, not per element: run 38).
    if (full) {
      UNROLL for (uint n = 0u; n < NF; ++n) {
        UNROLL for (uint i = 0u; i < 8u; ++i) {
          const uint hh = (i >> ROW_SHIFT) & 1u;
          s[n][i] = exp2(s[n][i] * s2 - lse2[hh]) * (dp[n][i] - dd[hh]);
        }
      }
    } else {
      UNROLL for (uint n = 0u; n < NF; ++n) {
        UNROLL for (uint i = 0u; i < 8u; ++i) {
          const uint hh = (i >> ROW_SHIFT) & 1u;
          const uint c = n * 16u + lane_col(lane, i);
          const bool visible = c0 + c <= row[hh] && row[hh] < pc.seq && rseg[hh] != 0 && sseg[c] == rseg[hh];
          const float p = visible ? exp2(s[n][i] * s2 - lse2[hh]) : 0.0;
          s[n][i] = p * (dp[n][i] - dd[hh]);
        }
      }
    }
    // dq += dS K: dS (rounded to fp16 by the conversion) as A fragments, K staged row-major.
    FRAG_A dsa[NF];
    UNROLL for (uint n = 0u; n < NF; ++n) dsa[n] = TO_A(s[n]);
    UNROLL for (uint f = 0u; f < HF; ++f) {
      UNROLL for (uint n = 0u; n < NF; ++n) {
        FRAG_B kb;
        LOAD(kb, n * 16u * LD + 2u * f, ROW_MAJOR);
        acc[f] = MMA(dsa[n], kb, acc[f]);
      }
    }
  }
  const uint out_first = pc.out_off + (tok0 * nh + h) * d, out_ld = nh * d;

#else
  // ---- dk and dv: rows are keys of kv head g ----------------------------------------------
  const uint g = gl_WorkGroupID.y / pc.split, part = gl_WorkGroupID.y % pc.split, heads = rep / pc.split;
  const uint k_first = (tok0 * nkv + g) * d;
  // k as A fragments in registers; v staged at OWN for the whole loop (its A fragments are read
  // from there per tile: registers for both would spill next to two sets of accumulators).
  FRAG_A ka[HF];
  STAGE(k8, OWN, r0, ROWS, k_first, nkv * d);
  barrier();
  UNROLL for (uint k = 0u; k < HF; ++k)
    LOAD(ka[k], OWN + warp * 16u * LD + 2u * k, ROW_MAJOR);
  barrier();
  STAGE(v8, OWN, r0, ROWS, k_first, nkv * d);
  FRAG_C dv[HF];  // acc holds dk
  UNROLL for (uint f = 0u; f < HF; ++f) dv[f] = C_ZERO;

  for (uint hq = part * heads; hq < part * heads + heads; ++hq) {
    const uint h = g * rep + hq;
    const uint q_first = (tok0 * nh + h) * d;
    const uint stat = (b * nh + h) * pc.seq;
    // Query tiles from the one that holds the workgroup's first key (earlier queries see none).
    for (uint c0 = r0 / BT * BT; c0 < pc.seq; c0 += BT) {
      int clo, chi;
      bool cgap;
      segment_range(sbase, c0, BT, clo, chi, cgap);
      if (chi < rlo || clo > rhi) continue;  // no visible pair (the same decision in every subgroup)
      barrier();                             // every subgroup is done with the previous tile (and v is staged)
      STAGE(q8, 0u, c0, BT, q_first, nh * d);
      STAGE(do8, TILE, c0, BT, q_first, nh * d);
      for (uint c = gl_LocalInvocationIndex; c < BT; c += NT) {
        const bool inside = c0 + c < pc.seq;
        sseg[c] = inside ? seg[sbase + c0 + c] : 0;
        slse[c] = inside ? lse[pc.lse_off + stat + c0 + c] * float(LOG2E) : 0.0;
        sdrow[c] = inside ? drow[pc.drow_off + stat + c0 + c] : 0.0;
      }
      barrier();
#if defined(STORE_DS)
      const uint ds_head = (b * nh + h) * ds_head_size();
#endif
      if (c0 + BT <= rw) {  // every query of the tile is before this subgroup's first key
#if defined(STORE_DS)
        const FRAG_A zero = A_ZERO;
        UNROLL for (uint n = 0u; n < NF; ++n) STORE_DS_FRAG(zero, ds_head + ds_row(c0 + n * 16u) + rw, ds_row_len(c0 + n * 16u));
#endif
        continue;
      }
      const bool full = !rgap && !cgap && rlo == rhi && clo == chi && rlo == clo && c0 >= rw + 15u;

      // S^T = k Q^T and dP^T = v dout^T: Q and dout are staged [query][d], so Q^T and dout^T are
      // their column-major readings.
      FRAG_C s[NF], dp[NF];
      UNROLL for (uint n = 0u; n < NF; ++n) {
        s[n] = C_ZERO;
        dp[n] = C_ZERO;
      }
      UNROLL for (uint k = 0u; k < HF; ++k) {
        FRAG_A va;
        LOAD(va, OWN + warp * 16u * LD + 2u * k, ROW_MAJOR);
        UNROLL for (uint n = 0u; n < NF; ++n) {
          FRAG_B qb, db;
          LOAD(qb, n * 16u * LD + 2u * k, COL_MAJOR);
          s[n] = MMA(ka[k], qb, s[n]);
          LOAD(db, TILE + n * 16u * LD + 2u * k, COL_MAJOR);
          dp[n] = MMA(va, db, dp[n]);
        }
      }
      // P^T = exp2(S^T s2 - lse2[query]), 0 where masked (into s); dS^T = P^T (dP^T - D[query])
      // (into dp). The masked form only where some pair is not visible: one branch per tile
      // rather than one per element.
      if (full) {
        UNROLL for (uint n = 0u; n < NF; ++n) {
          UNROLL for (uint i = 0u; i < 8u; ++i) {
            const uint c = n * 16u + lane_col(lane, i);
            const float p = exp2(s[n][i] * s2 - slse[c]);
            s[n][i] = p;
            dp[n][i] = p * (dp[n][i] - sdrow[c]);
          }
        }
      } else {
        UNROLL for (uint n = 0u; n < NF; ++n) {
          UNROLL for (uint i = 0u; i < 8u; ++i) {
            const uint hh = (i >> ROW_SHIFT) & 1u;
            const uint c = n * 16u + lane_col(lane, i);
            const bool visible = row[hh] <= c0 + c && c0 + c < pc.seq && rseg[hh] != 0 && sseg[c] == rseg[hh];
            const float p = visible ? exp2(s[n][i] * s2 - slse[c]) : 0.0;
            s[n][i] = p;
            dp[n][i] = p * (dp[n][i] - sdrow[c]);
          }
        }
      }
      // dv += P^T dout, dk += dS^T Q: the left factors (rounded to fp16 by the conversion) as A
      // fragments, dout and Q staged row-major.
      FRAG_A pa[NF], dsa[NF];
      UNROLL for (uint n = 0u; n < NF; ++n) {
        pa[n] = TO_A(s[n]);
        dsa[n] = TO_A(dp[n]);
      }
#if defined(STORE_DS)
      // dS^T's fragment n (this subgroup's 16 keys x queries c0 + 16 n...) as rows of dS.
      UNROLL for (uint n = 0u; n < NF; ++n) STORE_DS_FRAG(dsa[n], ds_head + ds_row(c0 + n * 16u) + rw, ds_row_len(c0 + n * 16u));
#endif
      UNROLL for (uint f = 0u; f < HF; ++f) {
        UNROLL for (uint n = 0u; n < NF; ++n) {
          FRAG_B qb, db;
          LOAD(db, TILE + n * 16u * LD + 2u * f, ROW_MAJOR);
          dv[f] = MMA(pa[n], db, dv[f]);
          LOAD(qb, n * 16u * LD + 2u * f, ROW_MAJOR);
          acc[f] = MMA(dsa[n], qb, acc[f]);
        }
      }
    }
  }
  const uint out_first = pc.out_off + part * pc.part_stride + (tok0 * nkv + g) * d, out_ld = nkv * d;
  const uint dv_first = pc.dv_off + part * pc.part_stride + (tok0 * nkv + g) * d;
  UNROLL for (uint f = 0u; f < HF; ++f) {
    UNROLL for (uint i = 0u; i < 8u; ++i) {
      const uint hh = (i >> ROW_SHIFT) & 1u;
      if (row[hh] < pc.seq) o2[dv_first + row[hh] * out_ld + f * 16u + lane_col(lane, i)] = dv[f][i];
    }
  }
#endif

  // dq or dk times scale for this lane's elements; rows past the sequence are not written.
  const float out_scale = pc.scale;
  UNROLL for (uint f = 0u; f < HF; ++f) {
    UNROLL for (uint i = 0u; i < 8u; ++i) {
      const uint hh = (i >> ROW_SHIFT) & 1u;
      if (row[hh] < pc.seq) o[out_first + row[hh] * out_ld + f * 16u + lane_col(lane, i)] = acc[f][i] * out_scale;
    }
  }
}

// Paired, the two tiles run in a loop that is kept, so the shader holds one copy of row_tile:
// called twice in a row, the H200's driver made a dk/dv kernel at head_dim 128 that wrote nothing
// (docs/benchmarks.md, run 21).
void main() {
  const uint n = (pc.seq + ROWS - 1u) / ROWS, w = gl_WorkGroupID.x;
  const uint count = PAIRED && n - 1u - w != w ? 2u : 1u;
  [[dont_unroll]] for (uint t = 0u; t < count; ++t) {
    if (t > 0u) barrier();  // every subgroup is done with the shared memory of the first tile
    row_tile(t == 0u ? w : n - 1u - w);
  }
}
