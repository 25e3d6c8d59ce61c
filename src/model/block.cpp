#include "model/block.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "ops/elementwise.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace forja::model {

uint32_t lora_fold_pad(int64_t rank) { return static_cast<uint32_t>((rank + 63) / 64 * 64); }

uint32_t dequantised_ld(uint32_t in, uint32_t fold) { return in + std::max<uint32_t>(fold, 64); }

uint64_t dequantised_slot_bytes(uint64_t out, uint32_t in, uint32_t fold) {
  constexpr uint64_t kAlign = 4096;
  return ((out + fold) * dequantised_ld(in, fold) * 2 + kAlign - 1) / kAlign * kAlign;
}

uint64_t dequantised_scratch_bytes(const ModelConfig& c, uint32_t fold) {
  const uint64_t h = static_cast<uint64_t>(c.hidden_size), q = static_cast<uint64_t>(c.q_dim()),
                 kv = static_cast<uint64_t>(c.kv_dim()), in = static_cast<uint64_t>(c.intermediate_size);
  uint64_t bytes = 0;
  // (out, in) of q, k, v, o, gate, up, down
  for (auto [o, i] : {std::pair{q, h}, std::pair{kv, h}, std::pair{kv, h}, std::pair{h, q}, std::pair{in, h},
                      std::pair{in, h}, std::pair{h, in}})
    bytes += dequantised_slot_bytes(o, static_cast<uint32_t>(i), fold);
  return bytes;
}

std::vector<BlockTensor> block_tensors(const ModelConfig& c, int64_t lora_width) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, nh = c.num_heads, nkv = c.num_kv_heads;
  const int64_t q = nh * c.head_dim, kv = nkv * c.head_dim;
  using R = BlockRole;
  std::vector<BlockTensor> t = {{"h1", R::saved, H}, {"rstd1", R::saved, 1}};
  if (c.qk_norm)
    t.insert(t.end(),
             {{"q_raw", R::saved, q}, {"k_raw", R::saved, kv}, {"rstd_q", R::saved, nh}, {"rstd_k", R::saved, nkv}});
  t.insert(t.end(), {{"q", R::saved, q},
                     {"k", R::saved, kv},
                     {"v", R::saved, kv},
                     {"attention out", R::saved, q},
                     {"attention lse", R::saved, nh},
                     {"x2", R::saved, H},
                     {"h2", R::saved, H},
                     {"rstd2", R::saved, 1},
                     {"gate", R::saved, I},
                     {"up", R::saved, I},
                     {"swiglu", R::saved, I},
                     {"lora t", R::saved, lora_width},
                     {"dx", R::gradient, H},
                     {"dh", R::gradient, H},
                     {"datt", R::gradient, q},
                     {"dq", R::gradient, q},
                     {"dk", R::gradient, kv},
                     {"dv", R::gradient, kv}});
  if (c.qk_norm) t.insert(t.end(), {{"dq_raw", R::gradient, q}, {"dk_raw", R::gradient, kv}});
  t.insert(t.end(), {{"dgate", R::gradient, I},
                     {"dup", R::gradient, I},
                     {"dswiglu", R::gradient, I},
                     {"lora dt", R::gradient, lora_width}});
  return t;
}

int64_t block_elements_per_token(const ModelConfig& c, int64_t lora_width, BlockRole role) {
  int64_t n = 0;
  for (const BlockTensor& t : block_tensors(c, lora_width)) n += t.role == role ? t.per_token : 0;
  return n;
}

BlockActs allocate_block_acts(const ModelConfig& config, int64_t lora_width, uint64_t tokens,
                              const std::function<gpu::Buffer(uint64_t, const char*)>& alloc) {
  using Field = gpu::Buffer BlockActs::*;
  static const std::pair<const char*, Field> fields[] = {{"h1", &BlockActs::h1},
                                                         {"rstd1", &BlockActs::rstd1},
                                                         {"q_raw", &BlockActs::q_raw},
                                                         {"k_raw", &BlockActs::k_raw},
                                                         {"rstd_q", &BlockActs::rstd_q},
                                                         {"rstd_k", &BlockActs::rstd_k},
                                                         {"q", &BlockActs::q},
                                                         {"k", &BlockActs::k},
                                                         {"v", &BlockActs::v},
                                                         {"attention out", &BlockActs::att},
                                                         {"attention lse", &BlockActs::lse},
                                                         {"x2", &BlockActs::x2},
                                                         {"h2", &BlockActs::h2},
                                                         {"rstd2", &BlockActs::rstd2},
                                                         {"gate", &BlockActs::g},
                                                         {"up", &BlockActs::u},
                                                         {"swiglu", &BlockActs::act},
                                                         {"lora t", &BlockActs::t}};
  BlockActs a;
  for (const BlockTensor& t : block_tensors(config, lora_width)) {
    if (t.role != BlockRole::saved) continue;
    Field field = nullptr;
    for (const auto& [name, f] : fields)
      if (std::string_view(name) == t.name) field = f;
    if (!field) throw std::logic_error(std::string("the block table's tensor '") + t.name + "' has no buffer");
    a.*field = alloc(tokens * t.per_token * 4, t.name);
  }
  return a;
}

void BlockSteps::norm(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, const gpu::Buffer& y,
                      const gpu::Buffer& rstd, uint32_t tokens, uint32_t cols, float eps, bool mlp) {
  (void)mlp;
  ops::rmsnorm_forward(ctx, x, w, ops::DType::f32, y, rstd, tokens, cols, eps);
}

void BlockSteps::position(gpu::Context& ctx, const BaseWeights& base, size_t layer, uint32_t tokens,
                          const gpu::Buffer& positions, const BlockActs& a) {
  const ModelConfig& c = base.config;
  const BaseLayer& L = base.layers[layer];
  const uint32_t nh = static_cast<uint32_t>(c.num_heads), nkv = static_cast<uint32_t>(c.num_kv_heads),
                 d = static_cast<uint32_t>(c.head_dim);
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (c.qk_norm) {
    ops::rmsnorm_forward(ctx, a.q_raw, L.q_norm, ops::DType::f32, a.q, a.rstd_q, tokens * nh, d, eps);
    ops::rmsnorm_forward(ctx, a.k_raw, L.k_norm, ops::DType::f32, a.k, a.rstd_k, tokens * nkv, d, eps);
  }
  ops::rope_forward(ctx, a.q, positions, base.inv_freq, tokens, nh, d);
  ops::rope_forward(ctx, a.k, positions, base.inv_freq, tokens, nkv, d);
}

void BlockSteps::activation(gpu::Context& ctx, const BlockActs& a, uint32_t tokens, uint32_t cols) {
  ops::swiglu_forward(ctx, a.g, a.u, a.act, uint64_t(tokens) * cols);
}

void block_forward(gpu::Context& ctx, const BaseWeights& base, size_t layer, uint32_t tokens,
                   const gpu::Buffer& positions, const gpu::Buffer& x_in, const BlockActs& a, const gpu::Buffer* x_out,
                   BlockSteps& steps) {
  const ModelConfig& c = base.config;
  const BaseLayer& L = base.layers[layer];
  const uint32_t T = tokens, H = static_cast<uint32_t>(c.hidden_size), I = static_cast<uint32_t>(c.intermediate_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const uint64_t residual_bytes = uint64_t(T) * H * 4;
  using K = LinearKind;
  using ops::DType;

  steps.norm(ctx, x_in, L.input_norm, a.h1, a.rstd1, T, H, eps, false);
  steps.linear(K::Q, a.h1, c.qk_norm ? a.q_raw : a.q, false);
  steps.linear(K::K, a.h1, c.qk_norm ? a.k_raw : a.k, false);
  steps.linear(K::V, a.h1, a.v, false);
  steps.position(ctx, base, layer, T, positions, a);
  steps.attention(a);
  ctx.copy(x_in.slice(0, residual_bytes), a.x2.slice(0, residual_bytes));
  steps.linear(K::O, a.att, a.x2, true);  // x2 = x + o_proj(att)

  steps.norm(ctx, a.x2, L.post_norm, a.h2, a.rstd2, T, H, eps, true);
  steps.linear(K::Gate, a.h2, a.g, false);
  steps.linear(K::Up, a.h2, a.u, false);
  steps.activation(ctx, a, T, I);
  if (!x_out) {
    steps.down_input(a.act);
    return;
  }
  ctx.copy(a.x2.slice(0, residual_bytes), x_out->slice(0, residual_bytes));
  steps.linear(K::Down, a.act, *x_out, true);  // x_out = x2 + mlp
}

}  // namespace forja::model
