// A model directory made ready for the GPU: config.json, the safetensors weights uploaded as the
// frozen base (NF4 or dense) and the tokenizer, with user-facing errors (UserError naming the
// path and the fix) for anything missing or inconsistent. Shared by generate, eval and train.
//
//   auto ctx = gpu::Context::create(device);
//   app::LoadedModel m(*ctx, "Qwen3-0.6B", {.quant = model::BaseQuant::nf4});
//   m.config, m.base (BaseWeights on the GPU), m.tokenizer (data::Tokenizer)
//   auto lora = model::load_adapter(*ctx, m.config, "out/adapter");   // PEFT dir -> LoraSet
//
// It lives above model/ and data/ (docs/design.md): it joins the two.
#pragma once
#include <filesystem>
#include <optional>

#include "data/tokenizer.h"
#include "gpu/context.h"
#include "model/base_weights.h"
#include "model/config.h"

namespace forja::app {

struct ModelLoadOptions {
  model::BaseQuant quant = model::BaseQuant::nf4;
  bool tokenizer = true;  // false: skip tokenizer.json (the caller needs no text)
  // true: load tokenizer.json only if DIR has one (eval on token ids needs none); false: a
  // missing one is a UserError saying the command needs it (generate: text in and out).
  bool tokenizer_optional = false;
};

class LoadedModel {
 public:
  // Reads DIR/config.json and the tokenizer first (cheap checks), then uploads the weights.
  LoadedModel(gpu::Context& ctx, const std::filesystem::path& dir, const ModelLoadOptions& options = {});
  ~LoadedModel();  // frees the weights on the GPU
  LoadedModel(const LoadedModel&) = delete;
  LoadedModel& operator=(const LoadedModel&) = delete;

  std::filesystem::path dir;
  model::ModelConfig config;
  std::optional<data::Tokenizer> tokenizer;
  model::BaseWeights base;

 private:
  gpu::Context& ctx_;
};

}  // namespace forja::app
