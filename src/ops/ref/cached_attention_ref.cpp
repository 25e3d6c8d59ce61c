#include "ops/ref/cached_attention_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace forja::ref {

void cached_attention(double* out, const double* q, const double* k_cache, const double* v_cache, int64_t queries,
                      int64_t first_pos, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, double scale) {
  const int64_t d = head_dim, rep = n_heads / n_kv_heads, row = n_kv_heads * d;
  std::vector<double> s;
  for (int64_t t = 0; t < queries; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const double* qv = q + (t * n_heads + h) * d;
      const int64_t kvh = h / rep, n = first_pos + t + 1;
      s.assign(n, 0.0);
      double m = -INFINITY;
      for (int64_t p = 0; p < n; ++p) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qv[c] * k_cache[p * row + kvh * d + c];
        s[p] = dot * scale;
        m = std::max(m, s[p]);
      }
      double sum = 0;
      for (int64_t p = 0; p < n; ++p) sum += (s[p] = std::exp(s[p] - m));
      double* o = out + (t * n_heads + h) * d;
      for (int64_t c = 0; c < d; ++c) {
        double a = 0;
        for (int64_t p = 0; p < n; ++p) a += s[p] * v_cache[p * row + kvh * d + c];
        o[c] = a / sum;
      }
    }
}

}  // namespace forja::ref
