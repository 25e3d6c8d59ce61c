#version 450
// The per-row parts of the LM head fused with cross-entropy (ops/cross_entropy.h). The logits of
// one vocabulary chunk, [rows, cols] fp32 with row stride cols, come from ops::gemm; these kernels
// merge their softmax statistics across chunks and turn them into the loss and the gradient.
//
// stats holds four arrays of `tb` floats (tb = the row block's capacity):
//   m [r] = running max, s [tb + r] = running sum of exp(logit - m),
//   tl[2 tb + r] = logit of the target, lse[3 tb + r] = m + log(s) (written by ce_loss).
//
//   ce_stats     one workgroup per row: online (max, sum) over the chunk, merged into m, s
//                (initialised when pc.first); the target's logit when it lies in the chunk.
//                                                           (logits, targets, stats)
//   ce_loss      one workgroup: lse for every row, and loss_sum[0] += sum over rows with a target
//                of lse - tl. A target outside [0, vocab) other than -100 adds NaN, so the
//                trainer's non-finite check stops the run instead of skipping it silently.
//                                                           (targets, stats, loss_sum)
//   ce_grad      in place, logits -> softmax - onehot(target) (0 on rows without a target);
//                the 1 / N factor is the alpha of the next GEMM.   (logits, targets, stats)
//   ce_grad_f16  the same into a separate fp16 array (for an fp16 W); unscaled values lie in
//                [-1, 1] and do not underflow as (softmax - onehot) / N would.
//                                                           (logits, targets, stats, out)
//   ce_to_f16    y = fp16(x[x_off + 0..n)), two per uint: the GEMM operand for an fp16 W.  (x, y)
// Masked or empty values use the finite sentinel NEG: Vulkan does not promise IEEE infinities.
//! variant ce_stats -DSTATS
//! variant ce_loss -DLOSS
//! variant ce_grad -DGRAD
//! variant ce_grad_f16 -DGRAD -DOUT_F16
//! variant ce_to_f16 -DTO_F16
layout(local_size_x = 256) in;

#define NEG (-3.0e38)
#define IGNORE (-100)

layout(push_constant) uniform PC {
  uint rows, cols, v0, first, tgt_off, tb, vocab, n, x_off;
} pc;

#if defined(TO_F16)
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) writeonly buffer Y { uint y[]; };
#elif defined(LOSS)
layout(set = 0, binding = 0) readonly buffer Targets { int targets[]; };
layout(set = 0, binding = 1) buffer Stats { float stats[]; };
layout(set = 0, binding = 2) buffer LossSum { float loss_sum[]; };
#else
#if defined(GRAD) && !defined(OUT_F16)
layout(set = 0, binding = 0) buffer Logits { float logits[]; };
#else
layout(set = 0, binding = 0) readonly buffer Logits { float logits[]; };
#endif
layout(set = 0, binding = 1) readonly buffer Targets { int targets[]; };
#if defined(STATS)
layout(set = 0, binding = 2) buffer Stats { float stats[]; };
#else
layout(set = 0, binding = 2) readonly buffer Stats { float stats[]; };
#endif
#if defined(OUT_F16)
layout(set = 0, binding = 3) writeonly buffer Out { uint out_h[]; };
#endif
#endif

shared float red_m[256];
shared float red_s[256];

// Merges two (max, sum of exp(x - max)) pairs; NEG with sum 0 is the empty pair.
vec2 merge(vec2 a, vec2 b) {
  const float m = max(a.x, b.x);
  return vec2(m, a.y * exp(a.x - m) + b.y * exp(b.x - m));
}

#if defined(GRAD)
float grad(uint i) {
  const uint r = i / pc.cols, c = i % pc.cols;
  const int tgt = targets[pc.tgt_off + r];
  if (tgt == IGNORE) return 0.0;
  const float p = exp(logits[i] - stats[3u * pc.tb + r]);
  return int(pc.v0 + c) == tgt ? p - 1.0 : p;
}
#endif

void main() {
  const uint t = gl_LocalInvocationIndex;
#if defined(STATS)
  const uint r = gl_WorkGroupID.x;
  if (r >= pc.rows) return;  // uniform per workgroup
  vec2 ms = vec2(NEG, 0.0);
  for (uint c = t; c < pc.cols; c += 256u) {
    const float v = logits[r * pc.cols + c];
    if (v > ms.x) {
      ms = vec2(v, ms.y * exp(ms.x - v) + 1.0);
    } else {
      ms.y += exp(v - ms.x);
    }
  }
  red_m[t] = ms.x;
  red_s[t] = ms.y;
  barrier();
  for (uint w = 128u; w > 0u; w >>= 1) {
    if (t < w) {
      const vec2 a = merge(vec2(red_m[t], red_s[t]), vec2(red_m[t + w], red_s[t + w]));
      red_m[t] = a.x;
      red_s[t] = a.y;
    }
    barrier();
  }
  if (t == 0u) {
    vec2 old = pc.first != 0u ? vec2(NEG, 0.0) : vec2(stats[r], stats[pc.tb + r]);
    const vec2 a = merge(old, vec2(red_m[0], red_s[0]));
    stats[r] = a.x;
    stats[pc.tb + r] = a.y;
    const int tgt = targets[pc.tgt_off + r];
    if (tgt >= int(pc.v0) && tgt < int(pc.v0 + pc.cols)) {
      stats[2u * pc.tb + r] = logits[r * pc.cols + uint(tgt) - pc.v0];
    } else if (pc.first != 0u) {
      stats[2u * pc.tb + r] = 0.0;
    }
  }
#elif defined(LOSS)
  float acc = 0.0;
  for (uint r = t; r < pc.rows; r += 256u) {
    const float lse = stats[r] + log(stats[pc.tb + r]);
    stats[3u * pc.tb + r] = lse;
    const int tgt = targets[pc.tgt_off + r];
    if (tgt == IGNORE) continue;
    acc += tgt >= 0 && tgt < int(pc.vocab) ? lse - stats[2u * pc.tb + r] : uintBitsToFloat(0x7fc00000u);
  }
  red_s[t] = acc;
  barrier();
  for (uint w = 128u; w > 0u; w >>= 1) {
    if (t < w) red_s[t] += red_s[t + w];
    barrier();
  }
  if (t == 0u) loss_sum[0] += red_s[0];
#elif defined(GRAD) && !defined(OUT_F16)
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += gl_NumWorkGroups.x * 256u) logits[i] = grad(i);
#elif defined(GRAD)
  for (uint u = gl_GlobalInvocationID.x; 2u * u < pc.n; u += gl_NumWorkGroups.x * 256u) {
    const float g0 = grad(2u * u), g1 = 2u * u + 1u < pc.n ? grad(2u * u + 1u) : 0.0;
    out_h[u] = packHalf2x16(vec2(g0, g1));
  }
#else  // TO_F16
  for (uint u = gl_GlobalInvocationID.x; 2u * u < pc.n; u += gl_NumWorkGroups.x * 256u) {
    const float a = x[pc.x_off + 2u * u], b = 2u * u + 1u < pc.n ? x[pc.x_off + 2u * u + 1u] : 0.0;
    y[u] = packHalf2x16(vec2(a, b));
  }
#endif
}
