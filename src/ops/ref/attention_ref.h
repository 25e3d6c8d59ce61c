// Causal self-attention with GQA and optional packed-segment masking (formats.md 1.6):
// double-precision reference of the forward (output + per-row logsumexp) and the backward.
//
// Layout, per batch of `batch` sequences of `seq` tokens (token-major, as the projections
// produce it):
//   q, out, dq, dout: [batch, seq, n_heads, head_dim]
//   k, v, dk, dv:     [batch, seq, n_kv_heads, head_dim]
//   lse:              [batch, seq, n_heads]   (one value per row of q)
//   segment_ids:      [batch, seq] or nullptr
// Query head h reads kv head h / (n_heads / n_kv_heads) (repeat_kv); n_heads % n_kv_heads == 0.
// scale = head_dim^-0.5; scores s_ij = scale * q_i . k_j.
//
// Mask: query i sees key j iff j <= i, and, when segment_ids is given, seg[j] == seg[i] != 0.
// A query with segment id 0 (padding) sees nothing: its output row is 0, its lse is -inf, and
// it gets and gives no gradient. Without segment ids every query sees at least itself.
//
// lse_i = log sum_{j visible} exp(s_ij) (natural log, of the scaled scores), so
// P_ij = exp(s_ij - lse_i) and out_i = sum_j P_ij v_j.
#pragma once
#include <cstdint>

namespace forja::ref {

void attention_forward(double* out, double* lse, const double* q, const double* k, const double* v,
                       const int32_t* segment_ids, int64_t batch, int64_t seq, int64_t n_heads,
                       int64_t n_kv_heads, int64_t head_dim);

// dq, dk, dv written with = (activation gradients); dk and dv of a kv head are summed over
// the n_heads / n_kv_heads query heads that share it. out and lse are the forward's.
//   D_i = dout_i . out_i;  dS_ij = P_ij (dout_i . v_j - D_i)
//   dq_i = scale sum_j dS_ij k_j;  dk_j = scale sum_i dS_ij q_i;  dv_j = sum_i P_ij dout_i
void attention_backward(double* dq, double* dk, double* dv, const double* dout, const double* q,
                        const double* k, const double* v, const double* out, const double* lse,
                        const int32_t* segment_ids, int64_t batch, int64_t seq, int64_t n_heads,
                        int64_t n_kv_heads, int64_t head_dim);

}  // namespace forja::ref
