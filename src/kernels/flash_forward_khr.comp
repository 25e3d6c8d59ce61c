#version 450
// The attention forward of mixed precision fused into one kernel (ops/attention_gemm.h: the GEMM
// path's forward where the device runs this; its backward stays on the GEMM kernels), on
// subgroup-scope cooperative matrices (GL_KHR_cooperative_matrix, 16x16x16 fp16 with fp32
// accumulation), FlashAttention-2 structure with the softmax in registers:
//
// one workgroup per (tile of BR = 16 x WARPS query rows, head h, sequence); each subgroup owns 16
// query rows, holds their q as A fragments and their output as HD/16 accumulators for the whole
// loop. Per key tile of BC keys, the workgroup stages K and V (fp16 copies the host makes, rounded
// to nearest even as every fp16 operand of forja) in shared memory; each subgroup computes its
// S = Q K^T (BC/16 accumulators), the online softmax on its own elements (row maxima across the
// four lanes that share a row, by subgroup shuffles; each lane's share of the row sums, added
// across the lanes at the end), rescales its accumulators,
// converts P to A fragments (GL_NV_cooperative_matrix2's conversion between uses) and adds P V.
// No [S, S] matrix exists anywhere and nothing goes through memory between the products.
//
// The softmax works on the accumulator's elements by their row and column, which the cooperative
// -matrix extensions leave to the implementation. This kernel assumes the lane pattern of NVIDIA's
// m16n8k16 accumulator: lane l holds rows l/4 and l/4 + 8, columns 2 (l % 4) + {0, 1} and those
// + 8, eight elements whose order (which bit of i picks the row half, which the column half) is a
// specialization constant. The host runs coopmat_layout_probe once per device and uses the kernel
// only where the device stores exactly one of those orders (ops::attention_fused_forward_supported).
//
// Mask and outputs as ops/attention.h: query i sees key j iff j <= i and seg[j] == seg[i] != 0;
// out = softmax(scale q k^T) v in fp32 [B*S, nh, d], lse = log-sum-exp (natural log) [B, nh, S],
// -inf and out 0 for rows that see nothing. Scores are in log2 units (scale * log2(e) folded in,
// exp2). Key tiles with no visible pair (past the causal limit, or segment ranges that do not
// meet) are skipped; a subgroup skips a key tile entirely after its last row.
//
// Specialization constants: 0 workgroup size (32 x WARPS), 1 WARPS, 2 BC, 3 HD (= head_dim, a
// multiple of 16 up to 128), 4 ROW_SHIFT and 5 COL_SHIFT (the accumulator's element order), 6
// PREFETCH (the next key tile's loads in flight during this one's products), 7 PAIRED (each
// workgroup takes two query tiles, see main).
// flash_fwd_khr_emu: the same without cooperative matrices (flash_khr_common.glsl), WARPS 1.
//! variant flash_fwd_khr requires=nv_coopmat2
//! variant flash_fwd_khr_emu -DEMULATE
//! variant coopmat_layout_probe -DPROBE requires=khr_coopmat
#extension GL_GOOGLE_include_directive : enable

#if defined(PROBE)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
// Writes, for the 16x16 fp32 accumulator, lane * 64 + i at the place of element i of each lane
// (row-major), and the elements per lane after the matrix.
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) writeonly buffer Out { float o[]; };
void main() {
  coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c;
  for (uint i = 0u; i < c.length(); ++i) c[i] = float(gl_SubgroupInvocationID * 64u + i);
  coopMatStore(c, o, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  if (gl_SubgroupInvocationID == 0u) o[256] = float(c.length());
}
#else
#include "flash_khr_extensions.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint WARPS = 4;
layout(constant_id = 2) const uint BC = 64;
layout(constant_id = 3) const uint HD = 128;
// The accumulator layout (the host's probe): element i of lane l is at row l/4 + 8 ((i >> ROW_SHIFT)
// & 1), column 2 (l % 4) + i % 2 + 8 ((i >> COL_SHIFT) & 1).
layout(constant_id = 4) const uint ROW_SHIFT = 2;
layout(constant_id = 5) const uint COL_SHIFT = 1;
// Whether the next key tile's k and v rows are loaded into registers while this one is computed
// (and stored to shared memory after it), or staged between the barriers.
layout(constant_id = 6) const bool PREFETCH = false;
// Whether workgroup w computes query tiles w and n - 1 - w (n tiles, grid of ceil(n / 2)) instead
// of tile w alone: under the causal mask tile t has t + 1 tiles' worth of keys, so the pairs all
// cost the same and no long tile is left running alone at the end (one sequence gives 4 waves of
// one workgroup per multiprocessor at 32 heads).
layout(constant_id = 7) const bool PAIRED = false;
// The ping-pong schedule (key_loop_pingpong): the first half of the subgroups runs its products
// while the second half runs its softmax, and the other way round, half a tile apart. Not with
// PREFETCH.
layout(constant_id = 8) const bool PINGPONG = false;

layout(push_constant) uniform PC {
  uint seq, n_heads, n_kv_heads, head_dim;
  float scale;
  uint q_off, k_off, v_off, seg_off, out_off, lse_off;  // element offsets (q, k, v: halves, multiples of 8)
} pc;

// fp16 copies of q, k, v [tokens, heads, d] (ops::to_f16_block, round to nearest even), 8 halves
// per uvec4; their offsets are in halves, multiples of 8.
layout(set = 0, binding = 0) readonly buffer Q { uvec4 q8[]; };
layout(set = 0, binding = 1) readonly buffer K { uvec4 k8[]; };
layout(set = 0, binding = 2) readonly buffer V { uvec4 v8[]; };
layout(set = 0, binding = 3) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 4) writeonly buffer Out { float o[]; };
layout(set = 0, binding = 5) writeonly buffer Lse { float lse[]; };

#define LOG2E 1.4426950408889634
#define LN2 0.6931471805599453
#define NEG_INF uintBitsToFloat(0xff800000u)

const uint BR = 16u * WARPS;
const uint NT = 32u * WARPS;
const uint HF = HD / 16u;  // fragments across head_dim
const uint NF = BC / 16u;  // fragments across a key tile
const uint CH = HD / 8u;   // uvec4 chunks (8 halves) per staged row
const uint LD = CH + 1u;   // staged row stride in uvec4: one chunk of padding against bank conflicts
const uint KV_SIZE = BC * LD;
const uint SH_SIZE = 2u * KV_SIZE > BR * LD ? 2u * KV_SIZE : BR * LD;

shared uvec4 sh[SH_SIZE];  // K at 0, V at KV_SIZE; before the loop, Q at 0
shared int sseg_k[2u * BC];  // the tile's segment ids at 0, or (PINGPONG) at BC times its parity

#include "flash_khr_common.glsl"

// The prefetch: this invocation's chunks of a key tile's k and v rows, PER of each.
const uint PER = (BC * CH + NT - 1u) / NT;
void fetch(uint k0, uint k_first, uint v_first, uint ld, out uvec4 pk[PER], out uvec4 pv[PER]) {
  UNROLL for (uint i = 0u; i < PER; ++i) {
    const uint x = gl_LocalInvocationIndex + i * NT, r = x / CH, c = x % CH;
    const bool inside = x < BC * CH && k0 + r < pc.seq;
    pk[i] = inside ? k8[(k_first + (k0 + r) * ld) / 8u + c] : uvec4(0u);
    pv[i] = inside ? v8[(v_first + (k0 + r) * ld) / 8u + c] : uvec4(0u);
  }
}
void put(const uvec4 pk[PER], const uvec4 pv[PER]) {
  UNROLL for (uint i = 0u; i < PER; ++i) {
    const uint x = gl_LocalInvocationIndex + i * NT, r = x / CH, c = x % CH;
    if (x < BC * CH) {
      sh[r * LD + c] = pk[i];
      sh[KV_SIZE + r * LD + c] = pv[i];
    }
  }
}

// The segment ids of the key tile from k0 at sseg_k[slot...] (0 past the sequence).
void stage_segment_ids(uint sbase, uint k0, uint slot) {
  for (uint c = gl_LocalInvocationIndex; c < BC; c += NT) sseg_k[slot + c] = k0 + c < pc.seq ? seg[sbase + k0 + c] : 0;
}

// S = Q K^T for the key tile staged at sh[0...] ([key][d], so K^T is its column-major reading).
void scores(const FRAG_A qa[HF], out FRAG_C s[NF]) {
  UNROLL for (uint n = 0u; n < NF; ++n) {
    s[n] = C_ZERO;
    UNROLL for (uint k = 0u; k < HF; ++k) {
      FRAG_B kb;
      LOAD(kb, n * 16u * LD + 2u * k, COL_MAJOR);
      s[n] = MMA(qa[k], kb, s[n]);
    }
  }
}

// This lane's two rows (the accumulator layout), their segments and the online softmax's state:
// running maxima m (log2 units) and this lane's shares l of the rows' sums.
struct Rows {
  uint row0, row1;
  int seg0, seg1;
  float m[2], l[2];
};

// The online softmax of the key tile from k0 (S in s, the tile's segment ids in sseg_k[slot...];
// `full`: every pair visible), O's accumulators rescaled and P as A fragments (rounded to fp16
// by the conversion) in pa: element i of a fragment is in row half (i >> ROW_SHIFT) & 1. The
// maxima are taken on the raw scores (s2 > 0 keeps their order) and the scale is folded into the
// exponent, one fma per element; masked scores are -inf, whose exp2 is 0. l holds this lane's
// share of each row's sum; the four lanes of a row add theirs at the end.
void softmax(inout FRAG_C s[NF], uint k0, bool full, uint slot, float s2, inout Rows r, inout FRAG_C acc[HF],
             out FRAG_A pa[NF]) {
  const uint lane = LANE;
  // The mask in a pass of its own, one branch per tile rather than one per element in the loop
  // the rest runs.
  if (!full) {
    UNROLL for (uint n = 0u; n < NF; ++n) {
      UNROLL for (uint i = 0u; i < 8u; ++i) {
        const uint hh = (i >> ROW_SHIFT) & 1u;
        const uint c = n * 16u + lane_col(lane, i);
        const uint qi = hh == 0u ? r.row0 : r.row1;
        const int sq = hh == 0u ? r.seg0 : r.seg1;
        if (k0 + c > qi || qi >= pc.seq || sq == 0 || sseg_k[slot + c] != sq) s[n][i] = NEG_INF;
      }
    }
  }
  float mx[2] = {NEG_INF, NEG_INF};
  UNROLL for (uint n = 0u; n < NF; ++n)
    UNROLL for (uint i = 0u; i < 8u; ++i) mx[(i >> ROW_SHIFT) & 1u] = max(mx[(i >> ROW_SHIFT) & 1u], s[n][i]);
  float alpha[2], m_use[2];
  UNROLL for (uint hh = 0u; hh < 2u; ++hh) {
    mx[hh] = max(mx[hh], SHUFFLE_XOR(mx[hh], 1u));
    mx[hh] = max(mx[hh], SHUFFLE_XOR(mx[hh], 2u));
    const float m_new = max(r.m[hh], mx[hh] * s2);
    m_use[hh] = m_new == NEG_INF ? 0.0 : m_new;  // a row that has seen nothing yet: exp2(-inf) = 0
    alpha[hh] = exp2(r.m[hh] - m_use[hh]);
    r.m[hh] = m_new;
    r.l[hh] *= alpha[hh];
  }
  UNROLL for (uint n = 0u; n < NF; ++n) {
    UNROLL for (uint i = 0u; i < 8u; ++i) {
      const uint hh = (i >> ROW_SHIFT) & 1u;
      const float p = exp2(fma(s[n][i], s2, -m_use[hh]));
      s[n][i] = p;
      r.l[hh] += p;
    }
  }
  UNROLL for (uint f = 0u; f < HF; ++f)
    UNROLL for (uint i = 0u; i < 8u; ++i) acc[f][i] *= alpha[(i >> ROW_SHIFT) & 1u];
  UNROLL for (uint n = 0u; n < NF; ++n) pa[n] = TO_A(s[n]);
}

// O += P V, V staged [key][d] row-major at sh[KV_SIZE...].
void add_pv(const FRAG_A pa[NF], inout FRAG_C acc[HF]) {
  UNROLL for (uint f = 0u; f < HF; ++f) {
    UNROLL for (uint n = 0u; n < NF; ++n) {
      FRAG_B vb;
      LOAD(vb, KV_SIZE + n * 16u * LD + 2u * f, ROW_MAJOR);
      acc[f] = MMA(pa[n], vb, acc[f]);
    }
  }
}

// Whether every pair of the subgroup's rows from qw and the key tile from k0 is visible: one
// segment throughout and every key at or before the first row.
bool all_visible(bool qgap, int qlo, int qhi, bool kgap, int klo, int khi, uint k0, uint qw) {
  return !qgap && !kgap && qlo == qhi && klo == khi && qlo == klo && k0 + BC <= qw + 1u;
}

// The key tiles of a query tile in the ping-pong schedule (PINGPONG). A subgroup's work per key
// tile is its products (S = Q K^T, and P V once its softmax is done) and its softmax; within a
// workgroup those serialise today: the barriers hold every subgroup in the same phase, so the
// softmax of all of them runs while the matrix cores wait (docs/benchmarks.md, run 35's
// ablations). Here each visible key tile t is one step of two halves between barriers, and
// subgroups w < WARPS/2 ("lead") and the others ("lag") run opposite work in each half:
//
//   step t, first half:  lead: P V of tile t-1, then S of tile t   lag: softmax of tile t-1
//   step t, second half: lead: softmax of tile t                    lag: P V of tile t-1, then S of t
//
// so a scheduler (NVIDIA places subgroup w on scheduler w % 4) holds one subgroup on the matrix
// cores and one in its softmax. Step t stages K of tile t and V of tile t-1 (both slots are free:
// their last readers ran in step t-1), so shared memory is what the plain loop uses; the tile's
// segment ids alternate between two slots, since the lag's softmax of tile t runs in step t+1.
// One step after the last visible tile stages its V alone. In the emulation every subgroup makes
// every call of both halves (its products and exchanges go through barriers) and keeps only the
// results of its own work.
void key_loop_pingpong(const FRAG_A qa[HF], uint qw, uint tiles, uint sbase, uint k_first, uint v_first, uint ld,
                       int qlo, int qhi, bool qgap, float s2, inout Rows r, inout FRAG_C acc[HF]) {
  const bool lead = WARP < WARPS / 2u;
  FRAG_C s[NF];
  FRAG_A pa[NF];
  UNROLL for (uint n = 0u; n < NF; ++n) {
    s[n] = C_ZERO;
    pa[n] = A_ZERO;
  }
  bool has_s = false, has_p = false;  // S waiting for its softmax; P waiting for its product with V
  uint s_k0 = 0u, s_slot = 0u;
  bool s_full = false;
  uint jp = tiles, slot = 0u;  // the previous visible tile (none yet); this step's segment slot
  for (uint j = 0u; j <= tiles; ++j) {
    const uint k0 = j * BC;
    int klo, khi;
    bool kgap = true;
    if (j < tiles) {
      segment_range(sbase, k0, BC, klo, khi, kgap);
      if (khi < qlo || klo > qhi) continue;  // no visible pair (the same decision in every subgroup)
    } else if (jp == tiles) {
      break;  // no V left to stage
    }
    barrier();  // every subgroup is done with the previous step's K and V
    if (j < tiles) {
      STAGE(k8, 0u, k0, BC, k_first, ld);
      stage_segment_ids(sbase, k0, slot);
    }
    if (jp < tiles) STAGE(v8, KV_SIZE, jp * BC, BC, v_first, ld);
    barrier();
    const bool run_s = j < tiles && k0 <= qw + 15u;  // not past this subgroup's last row
    const bool full = run_s && all_visible(qgap, qlo, qhi, kgap, klo, khi, k0, qw);
    [[dont_unroll]] for (uint part = 0u; part < 2u; ++part) {
      if (part == 1u) barrier();  // the roles swap
      const bool products = lead == (part == 0u);
#if defined(EMULATE)
      FRAG_C a2[HF], a3[HF], s3[NF], s4[NF];
      FRAG_A p2[NF];
      UNROLL for (uint f = 0u; f < HF; ++f) a2[f] = acc[f];
      add_pv(pa, a2);
      scores(qa, s3);
      if (products) {
        UNROLL for (uint f = 0u; f < HF; ++f) if (has_p) acc[f] = a2[f];
        UNROLL for (uint n = 0u; n < NF; ++n) if (run_s) s[n] = s3[n];
      }
      Rows r2 = r;
      UNROLL for (uint f = 0u; f < HF; ++f) a3[f] = acc[f];
      UNROLL for (uint n = 0u; n < NF; ++n) s4[n] = s[n];
      softmax(s4, s_k0, s_full, s_slot, s2, r2, a3, p2);
      if (!products && has_s) {
        r = r2;
        UNROLL for (uint f = 0u; f < HF; ++f) acc[f] = a3[f];
        UNROLL for (uint n = 0u; n < NF; ++n) pa[n] = p2[n];
      }
#else
      if (products) {
        if (has_p) add_pv(pa, acc);
        if (run_s) scores(qa, s);
      } else if (has_s) {
        softmax(s, s_k0, s_full, s_slot, s2, r, acc, pa);
      }
#endif
      if (products) {
        has_p = false;
        if (run_s) {
          has_s = true;
          s_k0 = k0, s_slot = slot, s_full = full;
        }
      } else if (has_s) {
        has_s = false;
        has_p = true;
      }
    }
    jp = j;
    slot ^= BC;
  }
}

// Query tile qt of head gl_WorkGroupID.y, sequence gl_WorkGroupID.z.
void query_tile(const uint qt) {
  const uint h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
  const uint warp = WARP, lane = LANE;
  const uint nh = pc.n_heads, nkv = pc.n_kv_heads, d = pc.head_dim;
  const uint g = h / (nh / nkv);
  const uint q0 = qt * BR, qw = q0 + warp * 16u;
  const uint tok0 = b * pc.seq, sbase = pc.seg_off + tok0;
  const uint q_first = pc.q_off + (tok0 * nh + h) * d;
  const uint k_first = pc.k_off + (tok0 * nkv + g) * d, v_first = pc.v_off + (tok0 * nkv + g) * d;

  // q: staged, then this subgroup's 16 rows as A fragments for the whole loop.
  STAGE(q8, 0u, q0, BR, q_first, nh * d);
  barrier();
  FRAG_A qa[HF];
  UNROLL for (uint k = 0u; k < HF; ++k)
    LOAD(qa[k], warp * 16u * LD + 2u * k, ROW_MAJOR);

  // This lane's two rows (the accumulator layout): r_lo and r_lo + 8 of the subgroup's 16.
  const uint r_lo = lane >> 2u;
  Rows r;
  r.row0 = qw + r_lo, r.row1 = qw + r_lo + 8u;
  r.seg0 = r.row0 < pc.seq ? seg[sbase + r.row0] : 0, r.seg1 = r.row1 < pc.seq ? seg[sbase + r.row1] : 0;
  r.m = float[2](NEG_INF, NEG_INF), r.l = float[2](0.0, 0.0);
  int qlo, qhi;
  bool qgap;
  segment_range(sbase, q0, BR, qlo, qhi, qgap);

  FRAG_C acc[HF];
  UNROLL for (uint f = 0u; f < HF; ++f) acc[f] = C_ZERO;
  const float s2 = pc.scale * float(LOG2E);

  const uint q_end = min(pc.seq, q0 + BR);
  const uint tiles = (q_end + BC - 1u) / BC;
  if (PINGPONG) {
    key_loop_pingpong(qa, qw, tiles, sbase, k_first, v_first, nkv * d, qlo, qhi, qgap, s2, r, acc);
  } else {
    // With the prefetch, jn is the next visible tile (its segment range in nlo, nhi, ngap), whose
    // loads are in flight. Without it, each tile's visibility is decided at its turn, in a loop
    // counted by j alone: the H100 ran that 8-15% faster than a loop stepping to the next visible
    // tile (B 1: 0.349 against 0.404 ms; docs/benchmarks.md, run 15).
    int nlo, nhi;
    bool ngap;
    uvec4 pk[PER], pv[PER];
    uint jn = PREFETCH ? next_visible_tile(0u, tiles, BC, sbase, qlo, qhi, nlo, nhi, ngap) : 0u;
    if (PREFETCH && jn < tiles) fetch(jn * BC, k_first, v_first, nkv * d, pk, pv);
    for (uint j = 0u; j < tiles; ++j) {
      const uint k0 = j * BC;
      int klo, khi;
      bool kgap;
      if (PREFETCH) {
        if (j != jn) continue;
        klo = nlo, khi = nhi, kgap = ngap;
      } else {
        segment_range(sbase, k0, BC, klo, khi, kgap);
        if (khi < qlo || klo > qhi) continue;  // no visible pair (the same decision in every subgroup)
      }
      barrier();  // every subgroup is done with the previous tile
      if (PREFETCH) {
        put(pk, pv);
      } else {
        STAGE(k8, 0u, k0, BC, k_first, nkv * d);
        STAGE(v8, KV_SIZE, k0, BC, v_first, nkv * d);
      }
      stage_segment_ids(sbase, k0, 0u);
      barrier();
      // With the prefetch, the next visible tile's loads go out now and land while this one is
      // computed.
      if (PREFETCH) {
        jn = next_visible_tile(j + 1u, tiles, BC, sbase, qlo, qhi, nlo, nhi, ngap);
        if (jn < tiles) fetch(jn * BC, k_first, v_first, nkv * d, pk, pv);
      }
      if (k0 > qw + 15u) continue;  // past this subgroup's last row
      FRAG_C s[NF];
      scores(qa, s);
      FRAG_A pa[NF];
      softmax(s, k0, all_visible(qgap, qlo, qhi, kgap, klo, khi, k0, qw), 0u, s2, r, acc, pa);
      add_pv(pa, acc);
    }
  }

  // The rows' sums from the lanes' shares; out = O / l for this lane's elements (two adjacent
  // columns per element pair); lse by the first lane of each row.
  UNROLL for (uint hh = 0u; hh < 2u; ++hh) {
    r.l[hh] += SHUFFLE_XOR(r.l[hh], 1u);
    r.l[hh] += SHUFFLE_XOR(r.l[hh], 2u);
  }
  const float inv[2] = {r.l[0] == 0.0 ? 0.0 : 1.0 / r.l[0], r.l[1] == 0.0 ? 0.0 : 1.0 / r.l[1]};
  const uint out_first = pc.out_off + (tok0 * nh + h) * d;
  UNROLL for (uint f = 0u; f < HF; ++f) {
    UNROLL for (uint i = 0u; i < 8u; ++i) {
      const uint hh = (i >> ROW_SHIFT) & 1u;
      const uint qi = hh == 0u ? r.row0 : r.row1;
      const uint c = f * 16u + lane_col(lane, i);
      if (qi < pc.seq) o[out_first + qi * nh * d + c] = acc[f][i] * inv[hh];
    }
  }
  if ((lane & 3u) == 0u) {
    const uint stat = pc.lse_off + (b * nh + h) * pc.seq;
    UNROLL for (uint hh = 0u; hh < 2u; ++hh) {
      const uint qi = hh == 0u ? r.row0 : r.row1;
      if (qi < pc.seq) lse[stat + qi] = r.l[hh] == 0.0 ? NEG_INF : (r.m[hh] + log2(r.l[hh])) * float(LN2);
    }
  }
}

// Paired, the two tiles run in a loop that is kept, so the shader holds one copy of query_tile
// (flash_backward_khr.comp's main says why).
void main() {
  const uint n = (pc.seq + BR - 1u) / BR, w = gl_WorkGroupID.x;
  const uint count = PAIRED && n - 1u - w != w ? 2u : 1u;
  [[dont_unroll]] for (uint t = 0u; t < count; ++t) {
    if (t > 0u) barrier();  // every subgroup is done with the shared memory of the first tile
    query_tile(t == 0u ? w : n - 1u - w);
  }
}
#endif
