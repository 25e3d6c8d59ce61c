// libFuzzer target for config.json (model/config.h) and its quantization_config (model/bnb4.h):
// parse_model_config accepts or throws UserError; an accepted config must also give its tensor
// list, parameter counts, LoRA shapes and RoPE frequencies without any other failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "io/json_file.h"
#include "model/bnb4.h"
#include "model/config.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const forja::model::ModelConfig c = forja::model::parse_model_config(text, "config.json");
    const auto counts = forja::model::count_parameters(c);
    if (counts.total() <= 0) std::abort();
    const auto shapes = forja::model::lora_target_shapes(c);
    if (shapes.num_layers != c.num_layers || shapes.targets.size() != 7) std::abort();
    // The tensor list and RoPE table are as large as the model is deep and wide; the config
    // parser bounds them, so building them for any accepted config must be cheap.
    const auto tensors = forja::model::expected_tensors(c);
    if (tensors.empty()) std::abort();
    const auto inv_freq = forja::model::rope_inv_freq(c);
    if (static_cast<std::int64_t>(inv_freq.size()) * 2 != c.head_dim) std::abort();
  } catch (const forja::UserError&) {
  }
  try {
    const auto j = forja::io::parse_json_strict(text, "config.json");
    (void)forja::model::parse_quantization_config(j, "config.json");
  } catch (const forja::UserError&) {
  }
  return 0;
}
