#version 450
// The small kernels around attention computed through the GEMM kernels (ops/attention_gemm.h):
// the products Q K^T, P V, dO V^T, dS K, dS^T Q and P^T dO run on the GEMM kernels (matrix
// cores where present); these kernels convert operands to fp16 and do the row-wise work between
// the products. Scratch matrices of one query chunk are head-major [nh, C, LDP], LDP = the number
// of keys rounded up to 8 so that every row starts 16-byte aligned for the GEMMs' vector loads.
//
//   attn_gemm_pack         fp32 [S, n_src, d] (one sequence) -> fp16 [n_src * rep, S, d]: head h of
//                          the output is source head h / rep (GQA's repeat of K and V per query
//                          head; rep = 1 converts Q or dO).       (src, dst)
//   attn_gemm_softmax      one workgroup per (chunk row i, head h): the causal, segment-masked
//                          softmax of the scaled scores; writes P in fp16 (masked and padding
//                          entries 0) and lse = m + log(l).       (scores, seg, P, lse)
//   attn_gemm_softmax_bwd  one workgroup per (chunk row i, head h): D_i = dout_i . out_i,
//                          P = exp(s - lse), dS = scale P (dP - D); writes P and dS in fp16.
//                          (scores, dP, seg, lse, out, dout, P, dS)
//   attn_gemm_sum_heads    dst [S, nkv, d] (fp32, one sequence) = the sum over the rep query heads
//                          of kv head g of src [nkv * rep, S, d].  (src, dst)
//
// The mask is that of ops/attention.h: key j is visible to query i iff j <= i and
// seg[j] == seg[i] != 0. Rows of padding (segment 0) get P = 0, lse = -inf and no gradient.
// Masked scores use the finite sentinel NEG, as attention.comp does. fp16 values are rounded
// with round_to_f16 (integer round-to-nearest-even) before packHalf2x16, so the packing is exact
// whatever rounding mode the driver's conversion uses.
//! variant attn_gemm_pack -DPACK
//! variant attn_gemm_softmax -DSOFTMAX
//! variant attn_gemm_softmax_bwd -DSOFTMAX_BWD
//! variant attn_gemm_sum_heads -DSUM_HEADS
#extension GL_EXT_control_flow_attributes : require
#include "f16_round.glsl"

#define THREADS 128u
#define NEG (-3.0e38)
#define NEG_INF_BITS 0xff800000u
layout(local_size_x = 128) in;

#if defined(PACK) || defined(SUM_HEADS)
layout(push_constant) uniform PC {
  uint seq, n_src, rep, head_dim;
  uint src_off, dst_off;  // element offsets into the bindings
  uint count;             // PACK: fp16 pairs to write; SUM_HEADS: fp32 elements to write
} pc;
#else
layout(push_constant) uniform PC {
  uint c0;                // the chunk's first query (position in the sequence)
  uint keys;              // keys 0 .. keys-1 of the sequence are in the scores (c0 + chunk rows)
  uint ldp;               // row stride of the scratch matrices (keys rounded up to 8)
  uint rows;              // query rows in the chunk
  uint seq, n_heads, head_dim;
  float scale;
  uint seg_off, lse_off, out_off, dout_off;  // element offsets into the bindings
} pc;
#endif

#if defined(PACK)
layout(set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

float source(uint e, uint total) {
  if (e >= total) return 0.0;
  const uint per_head = pc.seq * pc.head_dim;
  const uint h = e / per_head, r = e - h * per_head;
  const uint s = r / pc.head_dim, c = r - s * pc.head_dim;
  return src[pc.src_off + (s * pc.n_src + h / pc.rep) * pc.head_dim + c];
}

void main() {
  const uint total = pc.n_src * pc.rep * pc.seq * pc.head_dim;
  const uint stride = gl_NumWorkGroups.x * THREADS;
  for (uint p = gl_GlobalInvocationID.x; p < pc.count; p += stride)
    dst[pc.dst_off / 2u + p] =
        packHalf2x16(vec2(round_to_f16(source(2u * p, total)), round_to_f16(source(2u * p + 1u, total))));
}

#elif defined(SUM_HEADS)
layout(set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { float dst[]; };

void main() {
  const uint stride = gl_NumWorkGroups.x * THREADS;
  const uint per_head = pc.seq * pc.head_dim;
  for (uint e = gl_GlobalInvocationID.x; e < pc.count; e += stride) {
    // e indexes dst [S, n_src, d]
    const uint c = e % pc.head_dim, sg = e / pc.head_dim;
    const uint g = sg % pc.n_src, s = sg / pc.n_src;
    float acc = 0.0;
    for (uint j = 0u; j < pc.rep; ++j) acc += src[pc.src_off + (g * pc.rep + j) * per_head + s * pc.head_dim + c];
    dst[pc.dst_off + e] = acc;
  }
}

#else
layout(set = 0, binding = 0) readonly buffer Scores { float scores[]; };
#if defined(SOFTMAX)
layout(set = 0, binding = 1) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 2) writeonly buffer P { uint p16[]; };
layout(set = 0, binding = 3) writeonly buffer Lse { uint lse_bits[]; };
#else
layout(set = 0, binding = 1) readonly buffer DP { float dp[]; };
layout(set = 0, binding = 2) readonly buffer Seg { int seg[]; };
layout(set = 0, binding = 3) readonly buffer Lse { float lse[]; };
layout(set = 0, binding = 4) readonly buffer Out { float o[]; };
layout(set = 0, binding = 5) readonly buffer DOut { float dout[]; };
layout(set = 0, binding = 6) writeonly buffer P { uint p16[]; };
layout(set = 0, binding = 7) writeonly buffer DS { uint ds16[]; };
#endif

shared float red_a[THREADS];
shared float red_b[THREADS];

void main() {
  const uint i = gl_WorkGroupID.x, h = gl_WorkGroupID.y, t = gl_LocalInvocationIndex;
  const uint qi = pc.c0 + i;  // the query's position in the sequence
  const int sq = seg[pc.seg_off + qi];
  const uint row = (h * pc.rows + i) * pc.ldp;  // scratch row (elements)
  // Visible keys lie in [0, last): causal; segment equality is checked per key.
  const uint last = sq == 0 ? 0u : min(pc.keys, qi + 1u);

#if defined(SOFTMAX)
  // Online max and sum per thread, then combined across the workgroup.
  float m = NEG, l = 0.0;
  for (uint j = t; j < last; j += THREADS) {
    if (seg[pc.seg_off + j] != sq) continue;
    const float s = scores[row + j];
    if (s > m) {
      l = l * exp(m - s) + 1.0;
      m = s;
    } else {
      l += exp(s - m);
    }
  }
  red_a[t] = m;
  red_b[t] = l;
  barrier();
  for (uint w = THREADS / 2u; w > 0u; w >>= 1u) {
    if (t < w) {
      const float m1 = red_a[t], l1 = red_b[t], m2 = red_a[t + w], l2 = red_b[t + w];
      const float mm = max(m1, m2);
      red_a[t] = mm;
      red_b[t] = (l1 > 0.0 ? l1 * exp(m1 - mm) : 0.0) + (l2 > 0.0 ? l2 * exp(m2 - mm) : 0.0);
    }
    barrier();
  }
  const float lsum = red_b[0];
  const float lse_i = lsum > 0.0 ? red_a[0] + log(lsum) : 0.0;
  if (t == 0u) lse_bits[pc.lse_off + h * pc.seq + qi] = lsum > 0.0 ? floatBitsToUint(lse_i) : NEG_INF_BITS;
  for (uint jp = t; jp < pc.ldp / 2u; jp += THREADS) {
    float pv[2];
    [[unroll]] for (uint u = 0u; u < 2u; ++u) {
      const uint j = 2u * jp + u;
      pv[u] = j < last && seg[pc.seg_off + j] == sq ? exp(scores[row + j] - lse_i) : 0.0;
    }
    p16[row / 2u + jp] = packHalf2x16(vec2(round_to_f16(pv[0]), round_to_f16(pv[1])));
  }

#else  // SOFTMAX_BWD
  // D_i = dout_i . out_i over the head's d columns.
  const uint qrow = (qi * pc.n_heads + h) * pc.head_dim;
  float acc = 0.0;
  for (uint c = t; c < pc.head_dim; c += THREADS) acc += dout[pc.dout_off + qrow + c] * o[pc.out_off + qrow + c];
  red_a[t] = acc;
  barrier();
  for (uint w = THREADS / 2u; w > 0u; w >>= 1u) {
    if (t < w) red_a[t] += red_a[t + w];
    barrier();
  }
  const float D = red_a[0];
  const float lse_i = last > 0u ? lse[pc.lse_off + h * pc.seq + qi] : 0.0;
  for (uint jp = t; jp < pc.ldp / 2u; jp += THREADS) {
    float pv[2], dsv[2];
    [[unroll]] for (uint u = 0u; u < 2u; ++u) {
      const uint j = 2u * jp + u;
      const bool vis = j < last && seg[pc.seg_off + j] == sq;
      pv[u] = vis ? exp(scores[row + j] - lse_i) : 0.0;
      dsv[u] = vis ? pc.scale * pv[u] * (dp[row + j] - D) : 0.0;
    }
    p16[row / 2u + jp] = packHalf2x16(vec2(round_to_f16(pv[0]), round_to_f16(pv[1])));
    ds16[row / 2u + jp] = packHalf2x16(vec2(round_to_f16(dsv[0]), round_to_f16(dsv[1])));
  }
#endif
}
#endif
