// Double-precision reference of attention against a KV cache (ops/cached_attention.h):
//   q, out            [queries, n_heads, head_dim]
//   k_cache, v_cache  [positions, n_kv_heads, head_dim]
// Query t sees cache positions p <= first_pos + t; query head h reads kv head h / (n_heads /
// n_kv_heads). out_t = sum_p softmax_p(scale q_t . k_p) v_p.
#pragma once
#include <cstdint>

namespace forja::ref {

void cached_attention(double* out, const double* q, const double* k_cache, const double* v_cache, int64_t queries,
                      int64_t first_pos, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, double scale);

}  // namespace forja::ref
