// The frozen base model on the GPU: embedding, norms, and the seven projections of every layer,
// either NF4-quantised (QLoRA, the default) or dense. Loaded tensor by tensor from the mapped
// checkpoint so host memory stays near one tensor's size.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "gpu/context.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "ops/gemm.h"
#include "ops/nf4.h"

namespace forja::model {

enum class BaseQuant { nf4, none };

struct BaseWeightOptions {
  BaseQuant quant = BaseQuant::nf4;
  bool double_quant = true;
  // Dense weights (--quant none, embedding, LM head): fp32 in the reference precision, fp16 in
  // mixed precision (model::dense_dtype_for, model/precision.h). fp16 refuses values beyond its
  // range (UserError).
  ops::DType dense_dtype = ops::DType::f32;
};

// One frozen projection y = x W^T (+ b).
struct BaseLinear {
  uint32_t out = 0, in = 0;
  std::optional<ops::Nf4Weight> nf4;  // when quantised
  gpu::Buffer dense;                  // [out, in] dense_dtype, when not
  ops::DType dense_dtype = ops::DType::f32;
  gpu::Buffer bias;                   // fp32 [out], or invalid
};

struct BaseLayer {
  gpu::Buffer input_norm, post_norm;  // fp32 [H]
  gpu::Buffer q_norm, k_norm;         // fp32 [d] (Qwen3), else invalid
  std::array<BaseLinear, 7> linears;  // indexed by LinearKind
};

struct BaseWeights {
  ModelConfig config;
  ops::DType embed_dtype = ops::DType::f32;
  gpu::Buffer embedding;   // [V, H]
  gpu::Buffer lm_head;     // [V, H]; the embedding's buffer when tied
  gpu::Buffer final_norm;  // fp32 [H]
  gpu::Buffer inv_freq;    // fp32 [d/2] (RoPE, with the config's scaling)
  std::vector<BaseLayer> layers;
  uint64_t gpu_bytes = 0;  // what the base occupies on the GPU
};

// Checks every tensor's presence and shape against the config (UserError naming the tensor and
// the fix) and uploads it.
BaseWeights load_base_weights(gpu::Context& ctx, const io::SafetensorsCheckpoint& checkpoint,
                              const ModelConfig& config, const BaseWeightOptions& options);
void free_base_weights(gpu::Context& ctx, BaseWeights& w);

}  // namespace forja::model
