// LM head fused with the causal-LM cross-entropy (formats.md 6.1): double-precision reference.
//
//   logits[t, :] = x[t, :] W_lm^T          x [tokens, hidden], w_lm [vocab, hidden]
//   loss_t = lse_t - logits[t, labels[t]]  lse_t = log sum_v exp(logits[t, v])
//
// labels [tokens] are ALREADY SHIFTED: labels[t] is the target of position t (the token at
// t+1), or -100 (ignored). Use shift_labels to build them from unshifted labels.
// The forward returns the SUM of loss_t over non-ignored positions and their count; the loss
// that training reports is sum / N, where N is the count over all micro-batches of the optimizer
// step, and the backward gives d(sum / N)/dx for the N passed in.
//
// Two versions: the plain one materialises one row of logits at a time; the chunked one walks
// the vocabulary in chunks of `chunk` rows of W_lm with an online log-sum-exp (the GPU plan:
// never a [tokens, vocab] logits buffer) and recomputes each chunk in the backward.
// A label outside [0, vocab) other than -100 throws std::out_of_range.
#pragma once
#include <cstdint>

namespace forja::ref {

inline constexpr int32_t kIgnoreIndex = -100;

// shifted [batch, seq] = labels[:, 1:] padded on the right with -100 (T-LOSS ForCausalLMLoss).
void shift_labels(int32_t* shifted, const int32_t* labels, int64_t batch, int64_t seq);

// Returns sum_t loss_t over non-ignored t; *count = number of non-ignored t.
// losses [tokens] (0 where ignored) and lse [tokens] (computed for every t) may be nullptr.
double cross_entropy_forward(int64_t* count, double* losses, double* lse, const double* x,
                             const double* w_lm, const int32_t* labels, int64_t tokens,
                             int64_t hidden, int64_t vocab);

// dx [tokens, hidden] = d(sum / n_items)/dx = sum_v (softmax_tv - [v == label_t]) W_lm[v, :] /
// n_items, and 0 on ignored rows (written with =). n_items <= 0 gives dx = 0.
void cross_entropy_backward(double* dx, const double* x, const double* w_lm, const int32_t* labels,
                            int64_t n_items, int64_t tokens, int64_t hidden, int64_t vocab);

// Same results, computed over the vocabulary in chunks (the last chunk may be short).
double cross_entropy_forward_chunked(int64_t* count, double* losses, double* lse, const double* x,
                                     const double* w_lm, const int32_t* labels, int64_t tokens,
                                     int64_t hidden, int64_t vocab, int64_t chunk);
void cross_entropy_backward_chunked(double* dx, const double* x, const double* w_lm,
                                    const int32_t* labels, int64_t n_items, int64_t tokens,
                                    int64_t hidden, int64_t vocab, int64_t chunk);

}  // namespace forja::ref
