// Attention reference: materialises one row of scores at a time (O(seq) scratch), in double.
// See attention_ref.h for layout and masking.
#include "ops/ref/attention_ref.h"

#include <cmath>
#include <limits>
#include <vector>

#include "ops/ref/check_ref.h"

namespace forja::ref {

namespace {

struct Dims {
  int64_t batch, seq, nh, nkv, d, rep;
  double scale;
};

Dims check(const char* func, int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv_heads,
           int64_t head_dim) {
  detail::require_dims(func, {batch, seq, n_heads, n_kv_heads, head_dim});
  detail::require(n_heads > 0 && n_kv_heads > 0 && head_dim > 0, func,
                  "heads and head_dim must be positive");
  detail::require(n_heads % n_kv_heads == 0, func, "n_heads must be a multiple of n_kv_heads");
  Dims m{batch, seq, n_heads, n_kv_heads, head_dim, n_heads / n_kv_heads, 0.0};
  m.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  return m;
}

bool visible(const int32_t* seg, int64_t i, int64_t j) {
  if (j > i) return false;
  if (seg == nullptr) return true;
  return seg[i] != 0 && seg[j] == seg[i];
}

// Row offsets into q-like [B, S, nh, d] and kv-like [B, S, nkv, d] arrays.
int64_t qrow(const Dims& m, int64_t b, int64_t i, int64_t h) {
  return ((b * m.seq + i) * m.nh + h) * m.d;
}
int64_t kvrow(const Dims& m, int64_t b, int64_t j, int64_t g) {
  return ((b * m.seq + j) * m.nkv + g) * m.d;
}

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0.0;
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

}  // namespace

void attention_forward(double* out, double* lse, const double* q, const double* k, const double* v,
                       const int32_t* segment_ids, int64_t batch, int64_t seq, int64_t n_heads,
                       int64_t n_kv_heads, int64_t head_dim) {
  const Dims m = check("attention_forward", batch, seq, n_heads, n_kv_heads, head_dim);
  std::vector<double> s(static_cast<size_t>(seq));
  for (int64_t b = 0; b < m.batch; ++b) {
    const int32_t* seg = segment_ids == nullptr ? nullptr : segment_ids + b * m.seq;
    for (int64_t i = 0; i < m.seq; ++i) {
      for (int64_t h = 0; h < m.nh; ++h) {
        const int64_t g = h / m.rep;
        const double* qi = q + qrow(m, b, i, h);
        double* oi = out + qrow(m, b, i, h);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(seg, i, j)) continue;
          s[j] = m.scale * dot(qi, k + kvrow(m, b, j, g), m.d);
          mx = std::fmax(mx, s[j]);
        }
        for (int64_t c = 0; c < m.d; ++c) oi[c] = 0.0;
        double* lse_i = lse + (b * m.seq + i) * m.nh + h;
        if (mx == -std::numeric_limits<double>::infinity()) {  // nothing visible
          *lse_i = mx;
          continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(seg, i, j)) continue;
          const double p = std::exp(s[j] - mx);
          sum += p;
          const double* vj = v + kvrow(m, b, j, g);
          for (int64_t c = 0; c < m.d; ++c) oi[c] += p * vj[c];
        }
        for (int64_t c = 0; c < m.d; ++c) oi[c] /= sum;
        *lse_i = mx + std::log(sum);
      }
    }
  }
}

void attention_backward(double* dq, double* dk, double* dv, const double* dout, const double* q,
                        const double* k, const double* v, const double* out, const double* lse,
                        const int32_t* segment_ids, int64_t batch, int64_t seq, int64_t n_heads,
                        int64_t n_kv_heads, int64_t head_dim) {
  const Dims m = check("attention_backward", batch, seq, n_heads, n_kv_heads, head_dim);
  const int64_t nq = m.batch * m.seq * m.nh * m.d, nkv = m.batch * m.seq * m.nkv * m.d;
  for (int64_t x = 0; x < nq; ++x) dq[x] = 0.0;
  for (int64_t x = 0; x < nkv; ++x) dk[x] = 0.0;
  for (int64_t x = 0; x < nkv; ++x) dv[x] = 0.0;
  for (int64_t b = 0; b < m.batch; ++b) {
    const int32_t* seg = segment_ids == nullptr ? nullptr : segment_ids + b * m.seq;
    for (int64_t i = 0; i < m.seq; ++i) {
      for (int64_t h = 0; h < m.nh; ++h) {
        const int64_t g = h / m.rep;
        const double lse_i = lse[(b * m.seq + i) * m.nh + h];
        if (std::isinf(lse_i) && lse_i < 0) continue;  // row saw nothing
        const double* qi = q + qrow(m, b, i, h);
        const double* doi = dout + qrow(m, b, i, h);
        double* dqi = dq + qrow(m, b, i, h);
        const double di = dot(doi, out + qrow(m, b, i, h), m.d);
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(seg, i, j)) continue;
          const double* kj = k + kvrow(m, b, j, g);
          const double* vj = v + kvrow(m, b, j, g);
          const double p = std::exp(m.scale * dot(qi, kj, m.d) - lse_i);
          const double ds = p * (dot(doi, vj, m.d) - di);
          double* dkj = dk + kvrow(m, b, j, g);
          double* dvj = dv + kvrow(m, b, j, g);
          for (int64_t c = 0; c < m.d; ++c) {
            dqi[c] += m.scale * ds * kj[c];
            dkj[c] += m.scale * ds * qi[c];
            dvj[c] += p * doi[c];
          }
        }
      }
    }
  }
}

}  // namespace forja::ref
