// generation_config.json beside a model: the sampling defaults its authors chose (transformers'
// GenerationConfig). forja honours do_sample, temperature, top_k, top_p and eos_token_id when
// the command line does not set them.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace forja::model {

struct GenerationConfig {
  std::string path;        // "" when the model has none
  bool do_sample = false;  // transformers' default: greedy
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  std::vector<int64_t> eos_token_ids;
};

// DIR/generation_config.json, or the defaults when there is none. UserError for invalid JSON or
// fields of the wrong type.
GenerationConfig load_generation_config(const std::filesystem::path& model_dir);

}  // namespace forja::model
