#include "model/base_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "io/float16.h"
#include "model/bnb4.h"
#include "model/nf4.h"
#include "util/error.h"

namespace forja::model {

namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Dense tensors go up in pieces of this many elements (16 MiB of fp32): host memory stays at
// one piece however large the tensor (an 8B model's fp32 embedding is 2.5 GB).
constexpr int64_t kUploadChunk = int64_t(1) << 22;

// Uploads one dense tensor from `source`, converted to fp32 or fp16, piece by piece.
gpu::Buffer upload_dense(gpu::Context& ctx, BaseWeightSource& source, const TensorSpec& t, ops::DType dtype,
                         uint64_t& bytes) {
  source.open(t);
  const int64_t n = t.numel();
  const uint64_t es = ops::dtype_bytes(dtype);
  gpu::Buffer b = ctx.alloc(uint64_t(n) * es, t.name);
  std::vector<float> piece(static_cast<size_t>(std::min(n, kUploadChunk)));
  std::vector<uint16_t> half(dtype == ops::DType::f32 ? 0 : piece.size());
  for (int64_t first = 0; first < n; first += kUploadChunk) {
    const size_t count = static_cast<size_t>(std::min(kUploadChunk, n - first));
    source.read(t, first, std::span<float>(piece.data(), count));
    const gpu::Buffer dst = b.slice(uint64_t(first) * es, count * es);
    if (dtype == ops::DType::f32) {
      ctx.upload(dst, piece.data(), count * 4);
    } else {
      // bf16 (and fp32) checkpoints may hold values beyond fp16's range (65504); they would
      // become infinities, so they are refused (values below fp16's normal range lose
      // precision or flush to zero, as in any fp16 compute).
      for (size_t i = 0; i < count; ++i) {
        half[i] = io::float_to_f16(piece[i]);
        if (std::isinf(io::f16_to_float(half[i])) && std::isfinite(piece[i]))
          throw UserError("tensor " + t.name + " holds " + std::to_string(piece[i]) +
                          ", beyond fp16's range (65504) that --precision mixed stores it in; use --precision fp32");
      }
      ctx.upload(dst, half.data(), count * 2);
    }
  }
  source.close(t);
  bytes += b.size;
  return b;
}

// Reads tensors from a mapped checkpoint, checking each one's shape against the config. A
// projection stored as bitsandbytes NF4 (model/bnb4.h) is taken as stored: its codes become the
// NF4 base unchanged, and a dense read (--quant none) dequantises them.
class CheckpointSource : public BaseWeightSource {
 public:
  explicit CheckpointSource(const io::SafetensorsCheckpoint& ck) : ck_(ck) {}
  void open(const TensorSpec& t) override {
    if (t.role == TensorRole::linear && is_bnb4_weight(ck_, t.name)) {
      bnb_.emplace(read_bnb4_weight(ck_, t.name, t.shape));
      if (!told_) {
        std::fprintf(stderr, "base: using the checkpoint's bitsandbytes NF4 codes as stored (%s)\n",
                     bnb_->double_quant ? "double-quantised absmax" : "fp32 absmax");
        told_ = true;
      }
      return;
    }
    current_.emplace(ck_.tensor(t.name));  // UserError when absent
    if (current_->shape() != t.shape)
      throw UserError("tensor " + t.name + " has shape " + shape_string(current_->shape()) +
                      " but config.json implies " + shape_string(t.shape) +
                      "; the checkpoint and its config.json do not belong together");
  }
  void read(const TensorSpec&, int64_t first, std::span<float> out) override {
    if (bnb_) quant::nf4_dequantize(*bnb_, first, out);
    else current_->to_float(out, first);
  }
  quant::Nf4Tensor read_nf4(const TensorSpec&, const quant::Nf4Options& options) override {
    if (bnb_) return std::move(*bnb_);
    return nf4_quantize_tensor(*current_, options);
  }
  void close(const TensorSpec& t) override {
    ck_.release(t.name);  // its pages are uploaded: keep the resident set small
    if (bnb_)
      for (const std::string& suffix : bnb4_state_suffixes()) ck_.release(t.name + suffix);
    current_.reset();
    bnb_.reset();
  }

 private:
  const io::SafetensorsCheckpoint& ck_;
  std::optional<io::TensorView> current_;
  std::optional<quant::Nf4Tensor> bnb_;  // the open projection, when stored as bitsandbytes NF4
  bool told_ = false;
};

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

BaseWeights build_base_weights(gpu::Context& ctx, BaseWeightSource& source, const ModelConfig& c,
                               const BaseWeightOptions& options) {
  BaseWeights w;
  w.config = c;
  w.embed_dtype = options.dense_dtype;
  const int64_t V = c.vocab_size, H = c.hidden_size, d = c.head_dim;
  auto dense = [&](std::string name, TensorRole role, std::vector<int64_t> shape, ops::DType dtype) {
    return upload_dense(ctx, source, TensorSpec{std::move(name), role, std::move(shape)}, dtype, w.gpu_bytes);
  };
  const ops::DType f32 = ops::DType::f32;

  w.embedding = dense("model.embed_tokens.weight", TensorRole::embedding, {V, H}, w.embed_dtype);
  if (c.tie_word_embeddings) {
    w.lm_head = w.embedding;  // a tied checkpoint's lm_head.weight, if present, is a copy: ignored
  } else {
    w.lm_head = dense("lm_head.weight", TensorRole::lm_head, {V, H}, w.embed_dtype);
  }
  w.final_norm = dense("model.norm.weight", TensorRole::norm, {H}, f32);
  std::vector<float> inv_freq = rope_inv_freq(c);
  w.inv_freq = ctx.alloc(inv_freq.size() * 4, "rope inv_freq");
  ctx.upload(w.inv_freq, inv_freq);

  quant::Nf4Options nf4_options;
  nf4_options.double_quant = options.double_quant;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    BaseLayer layer;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    layer.input_norm = dense(p + "input_layernorm.weight", TensorRole::norm, {H}, f32);
    layer.post_norm = dense(p + "post_attention_layernorm.weight", TensorRole::norm, {H}, f32);
    if (c.qk_norm) {
      layer.q_norm = dense(p + "self_attn.q_norm.weight", TensorRole::norm, {d}, f32);
      layer.k_norm = dense(p + "self_attn.k_norm.weight", TensorRole::norm, {d}, f32);
    }
    for (LinearKind kind : kAllLinears) {
      const LinearShape s = linear_shape(c, kind);
      const std::string path = linear_path(i, kind);  // model.layers.{i}.self_attn.q_proj
      BaseLinear& lin = layer.linears[static_cast<int>(kind)];
      lin.out = static_cast<uint32_t>(s.out_features);
      lin.in = static_cast<uint32_t>(s.in_features);
      const TensorSpec weight{path + ".weight", TensorRole::linear, {s.out_features, s.in_features}};
      if (options.quant == BaseQuant::nf4) {
        source.open(weight);
        quant::Nf4Tensor q = source.read_nf4(weight, nf4_options);
        source.close(weight);
        lin.nf4 = ops::upload_nf4(ctx, q);
        w.gpu_bytes += q.storage_bytes();
      } else {
        lin.dense_dtype = options.dense_dtype;
        lin.dense = upload_dense(ctx, source, weight, options.dense_dtype, w.gpu_bytes);
      }
      if (s.bias) lin.bias = dense(path + ".bias", TensorRole::bias, {s.out_features}, f32);
    }
    w.layers.push_back(std::move(layer));
  }
  return w;
}

BaseWeights load_base_weights(gpu::Context& ctx, const io::SafetensorsCheckpoint& ck, const ModelConfig& c,
                              const BaseWeightOptions& options) {
  CheckpointSource source(ck);
  return build_base_weights(ctx, source, c, options);
}

void free_base_weights(gpu::Context& ctx, BaseWeights& w) {
  auto release = [&](gpu::Buffer& b) {
    if (b.valid()) ctx.free(b);
    b = {};
  };
  for (auto& layer : w.layers) {
    release(layer.input_norm);
    release(layer.post_norm);
    release(layer.q_norm);
    release(layer.k_norm);
    for (auto& lin : layer.linears) {
      if (lin.nf4) ops::free_nf4(ctx, *lin.nf4);
      release(lin.dense);
      release(lin.bias);
    }
  }
  w.layers.clear();
  const bool tied = w.lm_head.buffer == w.embedding.buffer && w.lm_head.offset == w.embedding.offset;
  if (!tied) release(w.lm_head);
  w.lm_head = {};
  release(w.embedding);
  release(w.final_norm);
  release(w.inv_freq);
}

}  // namespace forja::model
