// PEFT LoRA adapters (docs/formats.md §4): adapter_config.json and adapter_model.safetensors, in
// the form PEFT's save_pretrained writes and from_pretrained reads, so an adapter trained here
// loads in transformers/PEFT and one trained there loads here.
//
// Tensor names: base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}.weight with
// A [r, in_features] and B [out_features, r]; written as F32, read from F32, BF16 or F16.
//
// This layer knows nothing of model configs: the caller says which projections exist and their
// shapes (model::lora_target_shapes(config) builds that from a ModelConfig).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace forja::io {

// adapter_config.json, the fields forja writes and understands.
struct LoraConfig {
  std::string base_model_name_or_path;
  std::string revision;  // "" -> null
  std::int64_t r = 8;
  double lora_alpha = 8.0;
  double lora_dropout = 0.0;
  std::vector<std::string> target_modules;  // projection names, e.g. {"q_proj", ..., "down_proj"}
  bool use_rslora = false;
  bool inference_mode = true;  // PEFT writes true when saving

  // The factor applied to B·A: alpha / r, or alpha / sqrt(r) with rsLoRA.
  double scaling() const;
};

// One LoRA-targetable projection of a decoder layer.
struct LoraTarget {
  std::string name;         // "q_proj": what target_modules lists
  std::string module_path;  // "self_attn.q_proj": the path inside model.layers.{i}
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
};

// The projections a model offers for LoRA, identical in every layer.
struct LoraTargetShapes {
  std::int64_t num_layers = 0;
  std::vector<LoraTarget> targets;
  const LoraTarget* find(const std::string& name) const;
};

// The LoRA factors of one projection of one layer, fp32, row-major.
struct LoraWeights {
  std::int64_t layer = 0;
  std::string target;    // LoraTarget::name, e.g. "q_proj"
  std::vector<float> a;  // lora_A: [r, in_features]
  std::vector<float> b;  // lora_B: [out_features, r]
};

struct Adapter {
  LoraConfig config;
  std::vector<LoraWeights> weights;  // ordered by layer, then by config.target_modules
};

// "base_model.model.model.layers.{layer}.{module_path}.lora_{A|B}.weight"
std::string lora_tensor_name(std::int64_t layer, const std::string& module_path, char a_or_b);

// adapter_config.json text: sorted keys, 2-space indent, as PEFT writes it.
std::string adapter_config_json(const LoraConfig& config);

// Parses adapter_config.json; `source` names the file in errors. Rejects what forja cannot
// reproduce faithfully (DoRA, LoRA biases, rank/alpha patterns, modules_to_save, layer subsets,
// regex targets) with a message saying so.
LoraConfig parse_adapter_config(const std::string& text, const std::string& source);

// Resolves target_modules entries ("q_proj", "self_attn.q_proj", or "all-linear") to targets.
// Throws UserError naming `source` for an entry that matches no projection.
std::vector<const LoraTarget*> resolve_targets(const LoraConfig& config,
                                               const LoraTargetShapes& shapes,
                                               const std::string& source);

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (F32), each atomically,
// creating DIR. Checks every factor's size against `shapes` first.
void save_adapter(const std::filesystem::path& dir, const Adapter& adapter,
                  const LoraTargetShapes& shapes);

// Reads an adapter directory. Every (layer, target) pair must have both factors with shapes
// [r, in] and [out, r]; unknown or extra tensors are errors. Throws UserError naming the file,
// the tensor and the fix.
Adapter load_adapter(const std::filesystem::path& dir, const LoraTargetShapes& shapes);

// An adapter directory opened and checked exactly as load_adapter does (config, every factor
// present with its shape, no unexpected tensor), whose factors stay in the mapped file and are
// read on demand: a merge streams through it one projection at a time.
class AdapterFile {
 public:
  static AdapterFile open(const std::filesystem::path& dir, const LoraTargetShapes& shapes);
  const LoraConfig& config() const { return config_; }
  const std::vector<LoraTarget>& targets() const { return targets_; }  // resolved, model order
  std::int64_t num_layers() const { return num_layers_; }
  // lora_A [r, in] or lora_B [out, r] of one projection, in the dtype stored (F32, BF16, F16).
  TensorView factor(std::int64_t layer, const LoraTarget& target, char a_or_b) const;

 private:
  AdapterFile(LoraConfig config, std::vector<LoraTarget> targets, std::int64_t num_layers,
              SafetensorsFile file);
  LoraConfig config_;
  std::vector<LoraTarget> targets_;
  std::int64_t num_layers_ = 0;
  SafetensorsFile file_;
};

}  // namespace forja::io
