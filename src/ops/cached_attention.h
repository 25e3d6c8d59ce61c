// Attention of new queries against a KV cache, for generation (kernels/cached_attention.comp),
// fp32, GQA: query t of a chunk of `queries` tokens sits at cache position first_pos + t and
// sees every cached position p <= first_pos + t (causal; the chunk's own keys and values must
// already be in the cache). Semantics as forja::ref::cached_attention (ops/ref/cached_attention_ref.h).
//
// Layout (row-major):
//   q, out            fp32 [queries, n_heads, head_dim]
//   k_cache, v_cache  fp32 [positions, n_kv_heads, head_dim], positions >= first_pos + queries
// Query head h reads kv head h / (n_heads / n_kv_heads); n_heads % n_kv_heads == 0.
// Limits: 1 <= head_dim <= 128, queries <= 65535, each cache within one storage binding.
#pragma once
#include <cstdint>

#include "gpu/context.h"

namespace forja::ops {

void cached_attention(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k_cache, const gpu::Buffer& v_cache,
                      const gpu::Buffer& out, uint32_t queries, uint32_t first_pos, uint32_t n_heads,
                      uint32_t n_kv_heads, uint32_t head_dim, float scale);

}  // namespace forja::ops
