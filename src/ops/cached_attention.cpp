#include "ops/cached_attention.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/kernel_table.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {
struct CachedAttentionPush {
  uint32_t n_heads, n_kv_heads, head_dim, first_pos;
  float scale;
};
static_assert(kernels::push_block_matches<CachedAttentionPush>(kernels::cached_attention),
              "CachedAttentionPush differs from kernels/cached_attention.comp's push-constant block");
}  // namespace

void cached_attention(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k_cache, const gpu::Buffer& v_cache,
                      const gpu::Buffer& out, uint32_t queries, uint32_t first_pos, uint32_t n_heads,
                      uint32_t n_kv_heads, uint32_t head_dim, float scale) {
  const char* op = "cached_attention";
  if (queries == 0) return;
  if (head_dim == 0 || head_dim > 128) throw std::logic_error("cached_attention: head_dim must be in [1, 128]");
  if (n_kv_heads == 0 || n_heads % n_kv_heads != 0)
    throw std::logic_error("cached_attention: n_heads must be a multiple of n_kv_heads");
  if (queries > 65535) throw std::logic_error("cached_attention: more than 65535 queries in one call");
  const uint64_t q_bytes = uint64_t(queries) * n_heads * head_dim * 4;
  const uint64_t kv_bytes = (uint64_t(first_pos) + queries) * n_kv_heads * head_dim * 4;
  check_buffer(ctx, op, "q", q, q_bytes);
  check_buffer(ctx, op, "out", out, q_bytes);
  check_buffer(ctx, op, "k_cache", k_cache, kv_bytes);
  check_buffer(ctx, op, "v_cache", v_cache, kv_bytes);
  const uint64_t limit = ctx.info().max_storage_buffer_range;
  if (q_bytes > limit || kv_bytes > limit)
    throw std::logic_error("cached_attention: a tensor exceeds the device's storage-buffer binding limit");
  // Bind only what is read or written: a 16-byte rounded prefix of each buffer.
  auto prefix = [](const gpu::Buffer& b, uint64_t bytes) {
    return b.slice(0, std::min(b.size, (bytes + 15) / 16 * 16));
  };
  const auto& p = ctx.pipelines().get(kernels::cached_attention);
  const CachedAttentionPush push{n_heads, n_kv_heads, head_dim, first_pos, scale};
  const double keys = double(first_pos) * queries + double(queries) * (queries + 1) / 2;
  ctx.dispatch(p,
               {{prefix(q, q_bytes), gpu::Access::read},
                {prefix(k_cache, kv_bytes), gpu::Access::read},
                {prefix(v_cache, kv_bytes), gpu::Access::read},
                {prefix(out, q_bytes), gpu::Access::write}},
               push, n_heads, queries, 1, op, 4.0 * keys * n_heads * head_dim);
}

}  // namespace forja::ops
