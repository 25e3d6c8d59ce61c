#include "model/generator.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "ops/cached_attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/nf4.h"
#include "ops/rmsnorm.h"
#include "util/error.h"

namespace forja::model {

using ops::DType;
using ops::GemmShape;
using ops::MatrixView;

namespace {
constexpr uint64_t kMaxLogitBytes = 64ull << 20;  // one LM head GEMM's output
}

gpu::Buffer Generator::alloc(uint64_t bytes, const char* what) {
  gpu::Buffer b = ctx_.alloc(std::max<uint64_t>(bytes, 16), what);
  owned_.push_back(b);
  return b;
}

Generator::Generator(gpu::Context& ctx, const BaseWeights& base, const LoraSet* lora, uint32_t max_context,
                     uint32_t max_chunk)
    : ctx_(ctx),
      base_(base),
      lora_(lora),
      c_(base.config),
      max_context_(max_context),
      max_chunk_(std::max<uint32_t>(1, std::min(max_chunk, max_context))) {
  if (max_context == 0) throw UserError("the context length must be at least 1 token");
  if (base.embed_dtype != DType::f32) throw std::logic_error("Generator: the LM head must be fp32");
  const uint64_t T = max_chunk_, H = c_.hidden_size, nkv = c_.num_kv_heads, d = c_.head_dim, V = c_.vocab_size;
  const uint64_t cache_bytes = uint64_t(max_context) * nkv * d * 4;
  if (cache_bytes > ctx.info().max_storage_buffer_range)
    throw UserError("a context of " + std::to_string(max_context) + " tokens needs a KV cache of " +
                    std::to_string(cache_bytes >> 20) + " MiB per layer, more than this device binds at once (" +
                    std::to_string(ctx.info().max_storage_buffer_range >> 20) + " MiB); use a shorter context");
  uint64_t r = 0;  // the LoRA t buffer: [T, r] for one adapter at a time
  if (lora_)
    for (const LoraSlot& s : lora_->slots()) r = std::max<uint64_t>(r, s.rank);
  logit_rows_ = static_cast<uint32_t>(std::clamp<uint64_t>(kMaxLogitBytes / (V * 4), 1, T));
  ids_ = alloc(T * 4, "generator ids");
  positions_ = alloc(T * 4, "generator positions");
  x_ = alloc(T * H * 4, "generator residual");
  h_ = alloc(T * H * 4, "generator final norm");
  rstd_ = alloc(T * 4, "generator final rstd");
  acts_ = allocate_block_acts(c_, static_cast<int64_t>(r), T,
                              [&](uint64_t bytes, const char* what) { return alloc(bytes, what); });
  logits_ = alloc(uint64_t(logit_rows_) * V * 4, "generator logits");
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    k_cache_.push_back(alloc(cache_bytes, "k cache"));
    v_cache_.push_back(alloc(cache_bytes, "v cache"));
  }
}

Generator::~Generator() {
  for (auto& b : owned_) ctx_.free(b);
}

void Generator::truncate(uint32_t keep) {
  if (keep > position_) throw std::logic_error("Generator::truncate beyond the cached tokens");
  position_ = keep;  // later chunks overwrite the cache from here
}

// Generation's steps of a layer's forward (block_forward): fp32 projections with the LoRA update
// unmerged, attention of the chunk against the layer's KV cache after appending its keys and values.
class Generator::Steps : public BlockSteps {
 public:
  Steps(Generator& g, size_t layer, uint32_t rows, uint32_t first_position)
      : g_(g), layer_(layer), rows_(rows), p0_(first_position) {}

  void linear(LinearKind kind, const gpu::Buffer& x, const gpu::Buffer& y, bool accumulate) override {
    const BaseLinear& lin = g_.base_.layers[layer_].linears[static_cast<int>(kind)];
    const float beta = accumulate ? 1.0f : 0.0f;
    if (lin.nf4) {
      ops::nf4_gemm_xwt(g_.ctx_, x, *lin.nf4, y, rows_, 1.0f, beta);
    } else {
      ops::gemm(g_.ctx_, GemmShape{rows_, lin.out, lin.in, false, true, 1.0f, beta}, MatrixView{x, DType::f32, 0, lin.in},
                MatrixView{lin.dense, lin.dense_dtype, 0, lin.in}, MatrixView{y, DType::f32, 0, lin.out});
    }
    if (lin.bias.valid()) ops::add_row_bias(g_.ctx_, lin.bias, y, rows_, lin.out);
    if (!g_.lora_) return;
    if (const LoraSlot* s = g_.lora_->find(static_cast<int64_t>(layer_), kind)) {
      // t = x A^T [rows, r];  y += scale * t B^T
      const gpu::Buffer& t = g_.acts_.t;
      ops::gemm(g_.ctx_, GemmShape{rows_, s->rank, s->in, false, true}, MatrixView{x, DType::f32, 0, s->in},
                MatrixView{g_.lora_->a(*s), DType::f32, 0, s->in}, MatrixView{t, DType::f32, 0, s->rank});
      ops::gemm(g_.ctx_, GemmShape{rows_, s->out, s->rank, false, true, g_.lora_->scale(), 1.0f},
                MatrixView{t, DType::f32, 0, s->rank}, MatrixView{g_.lora_->b(*s), DType::f32, 0, s->rank},
                MatrixView{y, DType::f32, 0, s->out});
    }
  }

  void attention(const BlockActs& a) override {
    const ModelConfig& c = g_.c_;
    const uint32_t nh = static_cast<uint32_t>(c.num_heads), nkv = static_cast<uint32_t>(c.num_kv_heads),
                   d = static_cast<uint32_t>(c.head_dim);
    const uint64_t kv_row = uint64_t(nkv) * d * 4;  // bytes per cached position
    const gpu::Buffer &k_cache = g_.k_cache_[layer_], &v_cache = g_.v_cache_[layer_];
    g_.ctx_.copy(a.k.slice(0, rows_ * kv_row), k_cache.slice(p0_ * kv_row, rows_ * kv_row));
    g_.ctx_.copy(a.v.slice(0, rows_ * kv_row), v_cache.slice(p0_ * kv_row, rows_ * kv_row));
    ops::cached_attention(g_.ctx_, a.q, k_cache, v_cache, a.att, rows_, p0_, nh, nkv, d,
                          static_cast<float>(1.0 / std::sqrt(double(d))));
  }

 private:
  Generator& g_;
  size_t layer_;
  uint32_t rows_, p0_;
};

void Generator::forward_chunk(const int32_t* ids, uint32_t n, bool all_logits, std::vector<float>* logits) {
  const uint32_t H = static_cast<uint32_t>(c_.hidden_size), V = static_cast<uint32_t>(c_.vocab_size);
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const uint32_t p0 = position_;
  for (uint32_t t = 0; t < n; ++t)
    if (ids[t] < 0 || ids[t] >= int32_t(V))
      throw UserError("token id " + std::to_string(ids[t]) + " is outside the model's vocabulary of " +
                      std::to_string(V) + "; the tokenizer does not belong to this model");
  std::vector<int32_t> pos(n);
  for (uint32_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(p0 + t);
  ctx_.upload(ids_, ids, uint64_t(n) * 4);
  ctx_.upload(positions_, pos);

  ops::embedding_forward(ctx_, base_.embedding, base_.embed_dtype, ids_, x_, n, H, V);
  for (size_t i = 0; i < base_.layers.size(); ++i) {
    Steps steps(*this, i, n, p0);
    block_forward(ctx_, base_, i, n, positions_, x_, acts_, &x_, steps);
  }
  position_ = p0 + n;
  if (!logits) return;  // a prompt chunk before the last: only the cache matters
  ops::rmsnorm_forward(ctx_, x_, base_.final_norm, DType::f32, h_, rstd_, n, H, eps);
  // LM head on the rows asked for, logit_rows_ at a time.
  const uint32_t first = all_logits ? 0 : n - 1;
  for (uint32_t r0 = first; r0 < n; r0 += logit_rows_) {
    const uint32_t rows = std::min(logit_rows_, n - r0);
    ops::gemm(ctx_, GemmShape{rows, V, H, false, true}, MatrixView{h_, DType::f32, uint64_t(r0) * H, H},
              MatrixView{base_.lm_head, DType::f32, 0, H}, MatrixView{logits_, DType::f32, 0, V});
    const size_t at = logits->size();
    logits->resize(at + size_t(rows) * V);
    ctx_.download(logits_, logits->data() + at, uint64_t(rows) * V * 4);
  }
}

std::vector<float> Generator::forward(std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) throw std::logic_error("Generator::forward without tokens");
  if (position_ + tokens.size() > max_context_)
    throw UserError("the conversation has reached the context length of " + std::to_string(max_context_) +
                    " tokens; raise --max-context or start again");
  std::vector<float> logits;
  for (size_t t0 = 0; t0 < tokens.size(); t0 += max_chunk_) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(max_chunk_, tokens.size() - t0));
    const bool last = t0 + n == tokens.size();
    forward_chunk(tokens.data() + t0, n, all_logits, all_logits || last ? &logits : nullptr);
  }
  return logits;
}

GenerationResult generate(Generator& gen, std::span<const int32_t> prompt, uint32_t max_new_tokens,
                          std::span<const int32_t> stop_ids,
                          const std::function<int32_t(std::span<const float>)>& choose,
                          const std::function<void(int32_t)>& on_token) {
  GenerationResult result;
  if (max_new_tokens == 0) return result;
  std::vector<float> logits = gen.forward(prompt);
  for (;;) {
    const int32_t token = choose(logits);
    result.tokens.push_back(token);
    if (on_token) on_token(token);
    if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
      result.reason = StopReason::eos;
      return result;
    }
    if (result.tokens.size() >= max_new_tokens) {
      result.reason = StopReason::max_tokens;
      return result;
    }
    if (gen.position() >= gen.max_context()) {
      result.reason = StopReason::context_full;
      return result;
    }
    const int32_t fed[1] = {token};
    logits = gen.forward(fed);
  }
}

}  // namespace forja::model
