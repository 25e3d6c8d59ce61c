// The frozen base model on the GPU: embedding, norms, and the seven projections of every layer,
// either NF4-quantised (QLoRA, the default) or dense. Built tensor by tensor from a source (the
// mapped checkpoint, or random values for benchmarks: model/random_model.h) and uploaded in
// chunks, so host memory stays near one chunk (dense) or one quantised tensor (NF4).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpu/context.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "quant/nf4.h"
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

// What a base tensor is, so that a source of made-up values knows what to make.
enum class TensorRole { embedding, lm_head, norm, linear, bias };

struct TensorSpec {
  std::string name;  // the checkpoint name, e.g. model.layers.0.self_attn.q_proj.weight
  TensorRole role = TensorRole::linear;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// Where build_base_weights gets each tensor's values. For every tensor it calls open(), then
// either read() over consecutive element ranges (dense tensors) or read_nf4() once (projection
// weights when quantising), then close().
class BaseWeightSource {
 public:
  virtual ~BaseWeightSource() = default;
  // Checks that the tensor exists with this shape (UserError naming it and the fix).
  virtual void open(const TensorSpec& t) = 0;
  // Elements [first, first + out.size()) in row-major order, as fp32.
  virtual void read(const TensorSpec& t, int64_t first, std::span<float> out) = 0;
  // The tensor quantised to NF4.
  virtual quant::Nf4Tensor read_nf4(const TensorSpec& t, const quant::Nf4Options& options) = 0;
  // The tensor is on the GPU: its host copy may go.
  virtual void close(const TensorSpec&) {}
};

// Uploads every tensor the config implies (embedding, LM head unless tied, final norm, per
// layer the norms, q/k norms, projections and biases) from `source`, plus the RoPE table.
BaseWeights build_base_weights(gpu::Context& ctx, BaseWeightSource& source, const ModelConfig& config,
                               const BaseWeightOptions& options);

// Checks every tensor's presence and shape against the config (UserError naming the tensor and
// the fix) and uploads it.
BaseWeights load_base_weights(gpu::Context& ctx, const io::SafetensorsCheckpoint& checkpoint,
                              const ModelConfig& config, const BaseWeightOptions& options);
void free_base_weights(gpu::Context& ctx, BaseWeights& w);

}  // namespace forja::model
