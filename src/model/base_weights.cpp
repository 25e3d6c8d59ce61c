#include "model/base_weights.h"

#include <cmath>
#include <string>

#include "io/float16.h"
#include "model/nf4.h"
#include "util/error.h"

namespace forja::model {

namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

const io::TensorView checked(const io::SafetensorsCheckpoint& ck, const std::string& name,
                             const std::vector<int64_t>& shape) {
  const io::TensorView t = ck.tensor(name);  // UserError when absent
  if (t.shape() != shape)
    throw UserError("tensor " + name + " has shape " + shape_string(t.shape()) + " but config.json implies " +
                    shape_string(shape) + "; the checkpoint and its config.json do not belong together");
  return t;
}

// Uploads a tensor converted to fp32 or fp16. bf16 (and fp32) checkpoints hold values beyond
// fp16's range (65504); those would become infinities, so they are refused (values below fp16's
// normal range lose precision or flush to zero, as in any fp16 compute).
gpu::Buffer upload_dense(gpu::Context& ctx, const io::TensorView& t, ops::DType dtype, uint64_t& bytes) {
  std::vector<float> v = t.to_float();
  gpu::Buffer b;
  if (dtype == ops::DType::f32) {
    b = ctx.alloc(v.size() * 4, t.name());
    ctx.upload(b, v);
  } else {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      h[i] = io::float_to_f16(v[i]);
      if (std::isinf(io::f16_to_float(h[i])) && std::isfinite(v[i]))
        throw UserError("tensor " + t.name() + " holds " + std::to_string(v[i]) +
                        ", beyond fp16's range (65504) that --precision mixed stores it in; use --precision fp32");
    }
    b = ctx.alloc(h.size() * 2, t.name());
    ctx.upload(b, h);
  }
  bytes += b.size;
  return b;
}

}  // namespace

BaseWeights load_base_weights(gpu::Context& ctx, const io::SafetensorsCheckpoint& ck, const ModelConfig& c,
                              const BaseWeightOptions& options) {
  BaseWeights w;
  w.config = c;
  w.embed_dtype = options.dense_dtype;
  const int64_t V = c.vocab_size, H = c.hidden_size, d = c.head_dim;

  w.embedding = upload_dense(ctx, checked(ck, "model.embed_tokens.weight", {V, H}), w.embed_dtype, w.gpu_bytes);
  if (c.tie_word_embeddings) {
    w.lm_head = w.embedding;  // a tied checkpoint's lm_head.weight, if present, is a copy: ignored
  } else {
    w.lm_head = upload_dense(ctx, checked(ck, "lm_head.weight", {V, H}), w.embed_dtype, w.gpu_bytes);
  }
  w.final_norm = upload_dense(ctx, checked(ck, "model.norm.weight", {H}), ops::DType::f32, w.gpu_bytes);
  std::vector<float> inv_freq = rope_inv_freq(c);
  w.inv_freq = ctx.alloc(inv_freq.size() * 4, "rope inv_freq");
  ctx.upload(w.inv_freq, inv_freq);

  Nf4Options nf4_options;
  nf4_options.double_quant = options.double_quant;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    BaseLayer layer;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    layer.input_norm = upload_dense(ctx, checked(ck, p + "input_layernorm.weight", {H}), ops::DType::f32, w.gpu_bytes);
    layer.post_norm =
        upload_dense(ctx, checked(ck, p + "post_attention_layernorm.weight", {H}), ops::DType::f32, w.gpu_bytes);
    if (c.qk_norm) {
      layer.q_norm = upload_dense(ctx, checked(ck, p + "self_attn.q_norm.weight", {d}), ops::DType::f32, w.gpu_bytes);
      layer.k_norm = upload_dense(ctx, checked(ck, p + "self_attn.k_norm.weight", {d}), ops::DType::f32, w.gpu_bytes);
    }
    for (LinearKind kind : kAllLinears) {
      const LinearShape s = linear_shape(c, kind);
      const std::string path = linear_path(i, kind);  // model.layers.{i}.self_attn.q_proj
      BaseLinear& lin = layer.linears[static_cast<int>(kind)];
      lin.out = static_cast<uint32_t>(s.out_features);
      lin.in = static_cast<uint32_t>(s.in_features);
      const io::TensorView t = checked(ck, path + ".weight", {s.out_features, s.in_features});
      if (options.quant == BaseQuant::nf4) {
        Nf4Tensor q = nf4_quantize(t, nf4_options);
        lin.nf4 = ops::upload_nf4(ctx, q);
        w.gpu_bytes += q.storage_bytes();
      } else {
        lin.dense_dtype = options.dense_dtype;
        lin.dense = upload_dense(ctx, t, options.dense_dtype, w.gpu_bytes);
      }
      if (s.bias) lin.bias = upload_dense(ctx, checked(ck, path + ".bias", {s.out_features}), ops::DType::f32, w.gpu_bytes);
    }
    w.layers.push_back(std::move(layer));
  }
  return w;
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
