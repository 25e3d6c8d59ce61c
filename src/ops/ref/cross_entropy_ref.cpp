// Fused LM-head cross-entropy reference, plain and vocabulary-chunked. See cross_entropy_ref.h.
#include "ops/ref/cross_entropy_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/ref/check_ref.h"

namespace forja::ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

void check_labels(const char* func, const int32_t* labels, int64_t tokens, int64_t vocab) {
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t l = labels[t];
    if (l != kIgnoreIndex && (l < 0 || l >= vocab)) {
      throw std::out_of_range(std::string("forja::ref::") + func + ": label " + std::to_string(l) +
                              " at position " + std::to_string(t) + " is neither -100 nor in [0, " +
                              std::to_string(vocab) + ")");
    }
  }
}

double logit(const double* xt, const double* w_lm, int64_t v, int64_t hidden) {
  double acc = 0.0;
  for (int64_t c = 0; c < hidden; ++c) acc += xt[c] * w_lm[v * hidden + c];
  return acc;
}

// Online log-sum-exp state: running max and sum of exp(z - max).
struct OnlineLse {
  double m = kNegInf;
  double s = 0.0;
  // Folds in one chunk of logits z[n].
  void add(const double* z, int64_t n) {
    double cm = kNegInf;
    for (int64_t i = 0; i < n; ++i) cm = std::max(cm, z[i]);
    if (cm == kNegInf) return;
    const double nm = std::max(m, cm);
    double cs = 0.0;
    for (int64_t i = 0; i < n; ++i) cs += std::exp(z[i] - nm);
    s = s * std::exp(m - nm) + cs;  // exp(-inf) = 0 on the first chunk
    m = nm;
  }
  double value() const { return m + std::log(s); }
};

void check_common(const char* func, const int32_t* labels, int64_t tokens, int64_t hidden,
                  int64_t vocab) {
  detail::require_dims(func, {tokens, hidden, vocab});
  detail::require(vocab > 0, func, "vocab must be positive");
  check_labels(func, labels, tokens, vocab);
}

}  // namespace

void shift_labels(int32_t* shifted, const int32_t* labels, int64_t batch, int64_t seq) {
  detail::require_dims("shift_labels", {batch, seq});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      shifted[b * seq + t] = t + 1 < seq ? labels[b * seq + t + 1] : kIgnoreIndex;
    }
  }
}

double cross_entropy_forward(int64_t* count, double* losses, double* lse, const double* x,
                             const double* w_lm, const int32_t* labels, int64_t tokens,
                             int64_t hidden, int64_t vocab) {
  check_common("cross_entropy_forward", labels, tokens, hidden, vocab);
  std::vector<double> z(static_cast<size_t>(vocab));
  double sum = 0.0;
  int64_t n = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const double* xt = x + t * hidden;
    double mx = kNegInf;
    for (int64_t v = 0; v < vocab; ++v) {
      z[v] = logit(xt, w_lm, v, hidden);
      mx = std::max(mx, z[v]);
    }
    double s = 0.0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(z[v] - mx);
    const double lse_t = mx + std::log(s);
    if (lse != nullptr) lse[t] = lse_t;
    double loss_t = 0.0;
    if (labels[t] != kIgnoreIndex) {
      loss_t = lse_t - z[labels[t]];
      sum += loss_t;
      ++n;
    }
    if (losses != nullptr) losses[t] = loss_t;
  }
  if (count != nullptr) *count = n;
  return sum;
}

void cross_entropy_backward(double* dx, const double* x, const double* w_lm, const int32_t* labels,
                            int64_t n_items, int64_t tokens, int64_t hidden, int64_t vocab) {
  check_common("cross_entropy_backward", labels, tokens, hidden, vocab);
  std::vector<double> z(static_cast<size_t>(vocab));
  for (int64_t t = 0; t < tokens; ++t) {
    const double* xt = x + t * hidden;
    double* dxt = dx + t * hidden;
    for (int64_t c = 0; c < hidden; ++c) dxt[c] = 0.0;
    if (labels[t] == kIgnoreIndex || n_items <= 0) continue;
    double mx = kNegInf;
    for (int64_t v = 0; v < vocab; ++v) {
      z[v] = logit(xt, w_lm, v, hidden);
      mx = std::max(mx, z[v]);
    }
    double s = 0.0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(z[v] - mx);
    const double lse_t = mx + std::log(s);
    const double inv_n = 1.0 / static_cast<double>(n_items);
    for (int64_t v = 0; v < vocab; ++v) {
      const double g = (std::exp(z[v] - lse_t) - (v == labels[t] ? 1.0 : 0.0)) * inv_n;
      for (int64_t c = 0; c < hidden; ++c) dxt[c] += g * w_lm[v * hidden + c];
    }
  }
}

double cross_entropy_forward_chunked(int64_t* count, double* losses, double* lse, const double* x,
                                     const double* w_lm, const int32_t* labels, int64_t tokens,
                                     int64_t hidden, int64_t vocab, int64_t chunk) {
  check_common("cross_entropy_forward_chunked", labels, tokens, hidden, vocab);
  detail::require(chunk > 0, "cross_entropy_forward_chunked", "chunk must be positive");
  std::vector<double> z(static_cast<size_t>(std::min(chunk, vocab)));
  double sum = 0.0;
  int64_t n = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const double* xt = x + t * hidden;
    OnlineLse acc;
    double target = 0.0;
    for (int64_t v0 = 0; v0 < vocab; v0 += chunk) {
      const int64_t len = std::min(chunk, vocab - v0);
      for (int64_t i = 0; i < len; ++i) z[i] = logit(xt, w_lm, v0 + i, hidden);
      acc.add(z.data(), len);
      if (labels[t] >= v0 && labels[t] < v0 + len) target = z[labels[t] - v0];
    }
    const double lse_t = acc.value();
    if (lse != nullptr) lse[t] = lse_t;
    double loss_t = 0.0;
    if (labels[t] != kIgnoreIndex) {
      loss_t = lse_t - target;
      sum += loss_t;
      ++n;
    }
    if (losses != nullptr) losses[t] = loss_t;
  }
  if (count != nullptr) *count = n;
  return sum;
}

void cross_entropy_backward_chunked(double* dx, const double* x, const double* w_lm,
                                    const int32_t* labels, int64_t n_items, int64_t tokens,
                                    int64_t hidden, int64_t vocab, int64_t chunk) {
  check_common("cross_entropy_backward_chunked", labels, tokens, hidden, vocab);
  detail::require(chunk > 0, "cross_entropy_backward_chunked", "chunk must be positive");
  // Pass 1: per-token lse over all chunks (a kernel would save it from the forward).
  std::vector<double> lse(static_cast<size_t>(tokens));
  cross_entropy_forward_chunked(nullptr, nullptr, lse.data(), x, w_lm, labels, tokens, hidden,
                                vocab, chunk);
  // Pass 2: recompute each chunk's logits and accumulate its contribution to dx.
  std::vector<double> z(static_cast<size_t>(std::min(chunk, vocab)));
  for (int64_t t = 0; t < tokens; ++t) {
    double* dxt = dx + t * hidden;
    for (int64_t c = 0; c < hidden; ++c) dxt[c] = 0.0;
    if (labels[t] == kIgnoreIndex || n_items <= 0) continue;
    const double* xt = x + t * hidden;
    const double inv_n = 1.0 / static_cast<double>(n_items);
    for (int64_t v0 = 0; v0 < vocab; v0 += chunk) {
      const int64_t len = std::min(chunk, vocab - v0);
      for (int64_t i = 0; i < len; ++i) z[i] = logit(xt, w_lm, v0 + i, hidden);
      for (int64_t i = 0; i < len; ++i) {
        const double g = (std::exp(z[i] - lse[t]) - (v0 + i == labels[t] ? 1.0 : 0.0)) * inv_n;
        for (int64_t c = 0; c < hidden; ++c) dxt[c] += g * w_lm[(v0 + i) * hidden + c];
      }
    }
  }
}

}  // namespace forja::ref
