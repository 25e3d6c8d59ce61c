#include "model/block.h"

namespace forja::model {

std::vector<BlockTensor> block_tensors(const ModelConfig& c, int64_t lora_width) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, nh = c.num_heads, nkv = c.num_kv_heads;
  const int64_t q = nh * c.head_dim, kv = nkv * c.head_dim;
  using R = BlockRole;
  std::vector<BlockTensor> t = {{"h1", R::saved, H}, {"rstd1", R::saved, 1}};
  if (c.qk_norm)
    t.insert(t.end(), {{"q_raw", R::saved, q}, {"k_raw", R::saved, kv}, {"rstd_q", R::saved, nh},
                       {"rstd_k", R::saved, nkv}});
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

}  // namespace forja::model
