#include "app/loaded_model.h"

#include "io/safetensors.h"
#include "util/error.h"

namespace forja::app {

namespace fs = std::filesystem;

LoadedModel::LoadedModel(gpu::Context& ctx, const fs::path& model_dir, const ModelLoadOptions& options)
    : dir(model_dir), ctx_(ctx) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UserError("--model " + dir.string() +
                    ": not a directory; give a Hugging Face model directory (config.json, *.safetensors, "
                    "tokenizer.json)");
  config = model::load_model_config(dir);
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
  model::BaseWeightOptions bo;
  bo.quant = options.quant;
  base = model::load_base_weights(ctx, checkpoint, config, bo);
}

LoadedModel::~LoadedModel() { model::free_base_weights(ctx_, base); }

}  // namespace forja::app
