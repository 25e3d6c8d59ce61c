#version 450
// Causal GQA attention, flash-attention style (ops/attention.h has the layouts and the mask).
// Memory is O(S): a workgroup keeps one tile of queries and one tile of keys in shared memory and
// carries the softmax statistics (running max m, running sum l) per query row; no [S, S] score
// matrix exists anywhere. Everything is fp32.
//
//   attn_fwd        one workgroup per (query tile of BQ rows, head h, sequence): loops over the key
//                   tiles up to the causal limit with an online softmax; writes out and
//                   lse = m + log(l).      (q, k, v, seg, out, lse)
//   attn_bwd_dq     one workgroup per (query tile, head, sequence): D_i = dout_i . out_i (also
//                   written for attn_bwd_dkdv), then over the key tiles P = exp(s - lse),
//                   dS = P (dout v^T - D), dq = scale dS k.   (q, k, v, seg, out, lse, dout, dq, D)
//   attn_bwd_dkdv   one workgroup per (key tile of BK rows, kv head g, sequence): loops over the
//                   query heads of g and the query tiles at or after the key tile;
//                   dv = P^T dout, dk = scale dS^T q, summed over the heads in registers, so no
//                   atomics are needed.    (q, k, v, seg, lse, dout, D, dk, dv)
//
// Threads: 128 = 16 rows x 8 lanes. In the accumulation steps thread t owns row t / 8 of the
// output tile and the columns c = t % 8 + 8 j (j < DMAX / 8) in registers. A masked score is the
// finite sentinel NEG (not -inf: Vulkan does not promise IEEE infinities without
// SignedZeroInfNanPreserve); lse of a row that sees nothing is stored as the bits of -inf.
// Element offsets (pc.off*) let the host bind slices starting at aligned byte offsets.
//! variant attn_fwd -DFWD
//! variant attn_bwd_dq -DBWD_DQ
//! variant attn_bwd_dkdv -DBWD_DKDV
layout(local_size_x = 128) in;

#define THREADS 128u
#define LANES 8u
#define DMAX 128u
#define CPT 16u  // DMAX / LANES: columns per thread in the accumulators
#define NEG (-3.0e38)
#define NEG_INF_BITS 0xff800000u

layout(push_constant) uniform PC {
  uint seq, n_heads, n_kv_heads, head_dim;
  float scale;
  // Element offsets into the bindings, in binding order (unused ones are 0).
  uint off0, off1, off2, off3, off4, off5, off6, off7, off8;
} pc;

#if defined(FWD)
#define BQ 16u
#define BK 16u
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { float k[]; };
layout(set = 0, binding = 2) readonly buffer V { float v[]; };
layout(set = 0, binding = 3) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 4) writeonly buffer Out { float o[]; };
layout(set = 0, binding = 5) writeonly buffer Lse { uint lse_bits[]; };
#elif defined(BWD_DQ)
#define BQ 16u
#define BK 8u
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { float k[]; };
layout(set = 0, binding = 2) readonly buffer V { float v[]; };
layout(set = 0, binding = 3) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 4) readonly buffer Out { float o[]; };
layout(set = 0, binding = 5) readonly buffer Lse { float lse[]; };
layout(set = 0, binding = 6) readonly buffer DOut { float dout[]; };
layout(set = 0, binding = 7) writeonly buffer DQ { float dq[]; };
layout(set = 0, binding = 8) writeonly buffer DRow { float drow[]; };
#else
#define BQ 8u
#define BK 16u
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(set = 0, binding = 1) readonly buffer K { float k[]; };
layout(set = 0, binding = 2) readonly buffer V { float v[]; };
layout(set = 0, binding = 3) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 4) readonly buffer Lse { float lse[]; };
layout(set = 0, binding = 5) readonly buffer DOut { float dout[]; };
layout(set = 0, binding = 6) readonly buffer DRow { float drow[]; };
layout(set = 0, binding = 7) writeonly buffer DK { float dk[]; };
layout(set = 0, binding = 8) writeonly buffer DV { float dv[]; };
#endif

// Tiles; columns >= head_dim and rows past the sequence hold 0 so the loops need no bounds. Rows
// are DMAX + 1 floats apart so the threads of a score dot product, which read the same column of
// different rows, hit different shared-memory banks (16-way conflicts otherwise).
shared float sq[BQ][DMAX + 1u];  // queries (the forward pre-multiplies them by scale)
shared float sk[BK][DMAX + 1u];
shared float sv[BK][DMAX + 1u];
shared int sseg_q[BQ];
shared int sseg_k[BK];
// Whether any (query, key) pair of the current tiles is visible; a tile pair with none (earlier
// documents of a packed sequence) skips its softmax and accumulation, which would add zeros.
shared uint sany;
#if defined(FWD)
shared float sp[BQ][BK + 1u];  // scores, then probabilities of the current key tile
shared float srow_m[BQ], srow_l[BQ], srow_alpha[BQ];
#else
shared float sdo[BQ][DMAX + 1u];
shared float sds[BQ][BK + 1u];
shared float slse[BQ], sd[BQ];
#endif
#if defined(BWD_DKDV)
shared float sp[BQ][BK + 1u];
#endif
#if defined(BWD_DQ)
shared float sred[THREADS];
#endif

// Row offsets (elements, before the binding offset) in [seqs, S, heads, d] and [seqs, heads, S].
uint token_row(uint b, uint i, uint heads, uint h) { return ((b * pc.seq + i) * heads + h) * pc.head_dim; }
uint stat_index(uint b, uint h, uint i) { return (b * pc.n_heads + h) * pc.seq + i; }

bool visible(uint i, uint j, int seg_i, int seg_j) { return j <= i && seg_i != 0 && seg_j == seg_i; }

float dot_tile_q_k(uint r, uint kj) {
  float acc = 0.0;
  for (uint c = 0u; c < pc.head_dim; ++c) acc += sq[r][c] * sk[kj][c];
  return acc;
}

// Loads rows [row0, row0 + rows) of head `head` of a token-major array into a DMAX-wide tile,
// zero-filled outside the sequence and past head_dim. Defined per array by a macro because
// GLSL cannot pass buffers or shared arrays by reference.
#define LOAD_TILE(TILE, ROWS, SRC, OFF, HEADS, B, ROW0, HEAD, MUL)                   \
  for (uint e = gl_LocalInvocationIndex; e < (ROWS) * DMAX; e += THREADS) {          \
    const uint r_ = e / DMAX, c_ = e % DMAX, i_ = (ROW0) + r_;                       \
    float x_ = 0.0;                                                                  \
    if (i_ < pc.seq && c_ < pc.head_dim) x_ = SRC[(OFF) + token_row(B, i_, HEADS, HEAD) + c_] * (MUL); \
    TILE[r_][c_] = x_;                                                               \
  }

#define LOAD_SEG(TILE, ROWS, B, ROW0)                                                 \
  if (gl_LocalInvocationIndex < (ROWS)) {                                             \
    const uint i_ = (ROW0) + gl_LocalInvocationIndex;                                 \
    TILE[gl_LocalInvocationIndex] = i_ < pc.seq ? seg[pc.off3 + (B) * pc.seq + i_] : 0; \
  }

void main() {
  const uint t = gl_LocalInvocationIndex;
  const uint row = t / LANES, lane = t % LANES;
  const uint b = gl_WorkGroupID.z;
  const uint rep = pc.n_heads / pc.n_kv_heads;

#if defined(FWD)
  const uint q0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y, g = h / rep;
  LOAD_TILE(sq, BQ, q, pc.off0, pc.n_heads, b, q0, h, pc.scale)
  LOAD_SEG(sseg_q, BQ, b, q0)
  if (t < BQ) {
    srow_m[t] = NEG;
    srow_l[t] = 0.0;
  }
  float acc[CPT];
  for (uint j = 0u; j < CPT; ++j) acc[j] = 0.0;

  const uint k_end = min(pc.seq, q0 + BQ);  // causal: no query of this tile sees past it
  for (uint k0 = 0u; k0 < k_end; k0 += BK) {
    barrier();  // the previous tile's sk, sv, sp are no longer read
    LOAD_TILE(sk, BK, k, pc.off1, pc.n_kv_heads, b, k0, g, 1.0)
    LOAD_TILE(sv, BK, v, pc.off2, pc.n_kv_heads, b, k0, g, 1.0)
    LOAD_SEG(sseg_k, BK, b, k0)
    if (t == 0u) sany = 0u;
    barrier();
    for (uint e = t; e < BQ * BK; e += THREADS) {
      const uint r = e / BK, kj = e % BK, i = q0 + r, j = k0 + kj;
      float s = NEG;
      if (i < pc.seq && j < pc.seq && visible(i, j, sseg_q[r], sseg_k[kj])) {
        s = dot_tile_q_k(r, kj);
        sany = 1u;
      }
      sp[r][kj] = s;
    }
    barrier();
    if (sany == 0u) continue;  // uniform: every thread read the same value after the barrier
    // Online softmax, one thread per row: rescale by exp(m_old - m_new), add this tile's terms.
    if (t < BQ) {
      const float m_old = srow_m[t];
      float m_new = m_old;
      for (uint kj = 0u; kj < BK; ++kj) m_new = max(m_new, sp[t][kj]);
      float alpha = 1.0, l = srow_l[t];
      if (m_new > 0.5 * NEG) {  // the row has seen at least one key
        alpha = m_old > 0.5 * NEG ? exp(m_old - m_new) : 0.0;
        l *= alpha;
        for (uint kj = 0u; kj < BK; ++kj) {
          const float s = sp[t][kj];
          const float p = s > 0.5 * NEG ? exp(s - m_new) : 0.0;
          sp[t][kj] = p;
          l += p;
        }
      } else {
        for (uint kj = 0u; kj < BK; ++kj) sp[t][kj] = 0.0;
      }
      srow_m[t] = m_new;
      srow_l[t] = l;
      srow_alpha[t] = alpha;
    }
    barrier();
    const float alpha = srow_alpha[row];
    for (uint j = 0u; j < CPT; ++j) acc[j] *= alpha;
    for (uint kj = 0u; kj < BK; ++kj) {
      const float p = sp[row][kj];
      for (uint j = 0u; j < CPT; ++j) acc[j] += p * sv[kj][lane + LANES * j];
    }
  }
  barrier();
  const uint i = q0 + row;
  if (i < pc.seq) {
    const float l = srow_l[row];
    const float inv_l = l > 0.0 ? 1.0 / l : 0.0;  // a row that saw nothing (padding) is 0
    for (uint j = 0u; j < CPT; ++j) {
      const uint c = lane + LANES * j;
      if (c < pc.head_dim) o[pc.off4 + token_row(b, i, pc.n_heads, h) + c] = acc[j] * inv_l;
    }
  }
  if (t < BQ && q0 + t < pc.seq) {
    const float l = srow_l[t];
    lse_bits[pc.off5 + stat_index(b, h, q0 + t)] = l > 0.0 ? floatBitsToUint(srow_m[t] + log(l)) : NEG_INF_BITS;
  }

#elif defined(BWD_DQ)
  const uint q0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y, g = h / rep;
  LOAD_TILE(sq, BQ, q, pc.off0, pc.n_heads, b, q0, h, 1.0)
  LOAD_TILE(sdo, BQ, dout, pc.off6, pc.n_heads, b, q0, h, 1.0)
  LOAD_SEG(sseg_q, BQ, b, q0)
  barrier();
  // D_i = dout_i . out_i: 8 lanes per row, partial sums reduced through shared memory.
  {
    const uint i = q0 + row;
    float part = 0.0;
    if (i < pc.seq)
      for (uint c = lane; c < pc.head_dim; c += LANES)
        part += sdo[row][c] * o[pc.off4 + token_row(b, i, pc.n_heads, h) + c];
    sred[t] = part;
  }
  barrier();
  if (t < BQ) {
    const uint i = q0 + t;
    float d_i = 0.0;
    for (uint l = 0u; l < LANES; ++l) d_i += sred[t * LANES + l];
    sd[t] = d_i;
    slse[t] = i < pc.seq ? lse[pc.off5 + stat_index(b, h, i)] : 0.0;
    if (i < pc.seq) drow[pc.off8 + stat_index(b, h, i)] = d_i;
  }
  float acc[CPT];
  for (uint j = 0u; j < CPT; ++j) acc[j] = 0.0;

  const uint k_end = min(pc.seq, q0 + BQ);
  for (uint k0 = 0u; k0 < k_end; k0 += BK) {
    barrier();
    LOAD_TILE(sk, BK, k, pc.off1, pc.n_kv_heads, b, k0, g, 1.0)
    LOAD_TILE(sv, BK, v, pc.off2, pc.n_kv_heads, b, k0, g, 1.0)
    LOAD_SEG(sseg_k, BK, b, k0)
    if (t == 0u) sany = 0u;
    barrier();
    // dS_ij = P_ij (dout_i . v_j - D_i) with P_ij = exp(scale q_i . k_j - lse_i); 0 when masked
    // (padding rows have lse = -inf and are never visible, so it is never read for them).
    for (uint e = t; e < BQ * BK; e += THREADS) {
      const uint r = e / BK, kj = e % BK, i = q0 + r, j = k0 + kj;
      float ds = 0.0;
      if (i < pc.seq && j < pc.seq && visible(i, j, sseg_q[r], sseg_k[kj])) {
        const float p = exp(pc.scale * dot_tile_q_k(r, kj) - slse[r]);
        float dp = 0.0;
        for (uint c = 0u; c < pc.head_dim; ++c) dp += sdo[r][c] * sv[kj][c];
        ds = p * (dp - sd[r]);
        sany = 1u;
      }
      sds[r][kj] = ds;
    }
    barrier();
    if (sany == 0u) continue;
    for (uint kj = 0u; kj < BK; ++kj) {
      const float ds = sds[row][kj];
      for (uint j = 0u; j < CPT; ++j) acc[j] += ds * sk[kj][lane + LANES * j];
    }
  }
  {
    const uint i = q0 + row;
    if (i < pc.seq)
      for (uint j = 0u; j < CPT; ++j) {
        const uint c = lane + LANES * j;
        if (c < pc.head_dim) dq[pc.off7 + token_row(b, i, pc.n_heads, h) + c] = pc.scale * acc[j];
      }
  }

#else  // BWD_DKDV
  const uint k0 = gl_WorkGroupID.x * BK, g = gl_WorkGroupID.y;
  LOAD_TILE(sk, BK, k, pc.off1, pc.n_kv_heads, b, k0, g, 1.0)
  LOAD_TILE(sv, BK, v, pc.off2, pc.n_kv_heads, b, k0, g, 1.0)
  LOAD_SEG(sseg_k, BK, b, k0)
  float acc_dk[CPT], acc_dv[CPT];
  for (uint j = 0u; j < CPT; ++j) {
    acc_dk[j] = 0.0;
    acc_dv[j] = 0.0;
  }
  // Only queries at or after the key tile can see it (causal); BK is a multiple of BQ.
  for (uint h = g * rep; h < (g + 1u) * rep; ++h) {
    for (uint q0 = k0; q0 < pc.seq; q0 += BQ) {
      barrier();  // the previous query tile is no longer read
      LOAD_TILE(sq, BQ, q, pc.off0, pc.n_heads, b, q0, h, 1.0)
      LOAD_TILE(sdo, BQ, dout, pc.off5, pc.n_heads, b, q0, h, 1.0)
      LOAD_SEG(sseg_q, BQ, b, q0)
      if (t < BQ) {
        const uint i = q0 + t;
        slse[t] = i < pc.seq ? lse[pc.off4 + stat_index(b, h, i)] : 0.0;
        sd[t] = i < pc.seq ? drow[pc.off6 + stat_index(b, h, i)] : 0.0;
      }
      if (t == 0u) sany = 0u;
      barrier();
      for (uint e = t; e < BQ * BK; e += THREADS) {
        const uint r = e / BK, kj = e % BK, i = q0 + r, j = k0 + kj;
        float p = 0.0, ds = 0.0;
        if (i < pc.seq && j < pc.seq && visible(i, j, sseg_q[r], sseg_k[kj])) {
          p = exp(pc.scale * dot_tile_q_k(r, kj) - slse[r]);
          float dp = 0.0;
          for (uint c = 0u; c < pc.head_dim; ++c) dp += sdo[r][c] * sv[kj][c];
          ds = p * (dp - sd[r]);
          sany = 1u;
        }
        sp[r][kj] = p;
        sds[r][kj] = ds;
      }
      barrier();
      if (sany == 0u) continue;
      // Thread row = key kj of the tile: dv_j += sum_i P_ij dout_i, dk_j += sum_i dS_ij q_i.
      for (uint r = 0u; r < BQ; ++r) {
        const float p = sp[r][row], ds = sds[r][row];
        for (uint j = 0u; j < CPT; ++j) {
          const uint c = lane + LANES * j;
          acc_dv[j] += p * sdo[r][c];
          acc_dk[j] += ds * sq[r][c];
        }
      }
    }
  }
  {
    const uint j_row = k0 + row;
    if (j_row < pc.seq)
      for (uint j = 0u; j < CPT; ++j) {
        const uint c = lane + LANES * j;
        if (c < pc.head_dim) {
          dk[pc.off7 + token_row(b, j_row, pc.n_kv_heads, g) + c] = pc.scale * acc_dk[j];
          dv[pc.off8 + token_row(b, j_row, pc.n_kv_heads, g) + c] = acc_dv[j];
        }
      }
  }
#endif
}
