#include "model/loaded_model.h"

#include "io/adapter.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace forja::model {

namespace fs = std::filesystem;

LoadedModel::LoadedModel(gpu::Context& ctx, const fs::path& model_dir, const ModelLoadOptions& options)
    : dir(model_dir), ctx_(ctx) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UserError("--model " + dir.string() +
                    ": not a directory; give a Hugging Face model directory (config.json, *.safetensors, "
                    "tokenizer.json)");
  config = load_model_config(dir);
  if (options.tokenizer) {
    const fs::path file = dir / "tokenizer.json";
    if (fs::exists(file, ec)) {
      tokenizer.emplace(data::Tokenizer::load(dir));
    } else if (!options.tokenizer_optional) {
      throw UserError(file.string() +
                      ": not found; this command turns text into tokens and back, so it needs the "
                      "model's tokenizer: copy tokenizer.json (and tokenizer_config.json) from the "
                      "model's Hugging Face repository into " + dir.string());
    }
  }
  const io::SafetensorsCheckpoint checkpoint = io::SafetensorsCheckpoint::open(dir);
  BaseWeightOptions bo;
  bo.quant = options.quant;
  base = load_base_weights(ctx, checkpoint, config, bo);
}

LoadedModel::~LoadedModel() { free_base_weights(ctx_, base); }

std::unique_ptr<LoraSet> load_adapter(gpu::Context& ctx, const ModelConfig& config, const fs::path& adapter_dir) {
  std::error_code ec;
  if (!fs::is_directory(adapter_dir, ec))
    throw UserError("--adapter " + adapter_dir.string() +
                    ": not a directory; give a PEFT adapter directory (adapter_config.json + "
                    "adapter_model.safetensors)");
  const io::LoraTargetShapes shapes = lora_target_shapes(config);
  io::Adapter adapter = io::load_adapter(adapter_dir, shapes);
  // target_modules may say "all-linear" or "self_attn.q_proj": LoraSettings wants plain names.
  std::vector<std::string> names;
  for (const io::LoraTarget* t :
       io::resolve_targets(adapter.config, shapes, (adapter_dir / "adapter_config.json").string()))
    names.push_back(t->name);
  adapter.config.target_modules = names;
  auto lora = std::make_unique<LoraSet>(ctx, config, LoraSettings::from_peft(adapter.config));
  lora->load(adapter);
  return lora;
}

}  // namespace forja::model
