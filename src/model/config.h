// The model description: config.json of a Qwen3, Qwen2/2.5, Llama 3.x or Mistral checkpoint
// read into one ModelConfig (docs/formats.md §1.1, §1.7), plus what follows from it alone: the
// per-layer linear shapes, the expected safetensors names and shapes, parameter counts and the
// RoPE inverse-frequency table.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/adapter.h"

namespace forja::model {

enum class Architecture { Qwen3, Qwen2, Llama, Mistral };

enum class RopeType { Default, Linear, Llama3 };

struct RopeScaling {
  RopeType type = RopeType::Default;
  double factor = 1.0;                                   // linear, llama3
  double low_freq_factor = 1.0;                          // llama3
  double high_freq_factor = 4.0;                         // llama3
  std::int64_t original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  Architecture architecture = Architecture::Qwen3;
  std::string model_type;  // as written in config.json

  std::int64_t vocab_size = 0;         // V
  std::int64_t hidden_size = 0;        // H
  std::int64_t intermediate_size = 0;  // I
  std::int64_t num_layers = 0;         // L (num_hidden_layers)
  std::int64_t num_heads = 0;          // nh (num_attention_heads)
  std::int64_t num_kv_heads = 0;       // nkv (num_key_value_heads)
  std::int64_t head_dim = 0;           // d: explicit, else H / nh (Qwen3's default is 128)

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  std::int64_t max_position_embeddings = 0;

  bool tie_word_embeddings =
      false;              // LM head = embedding matrix (a lm_head.weight may still exist)
  bool qkv_bias = false;  // q/k/v_proj have biases (Qwen2 always; others attention_bias)
  bool o_bias = false;    // o_proj has a bias (Llama/Qwen3 attention_bias)
  bool mlp_bias = false;  // gate/up/down biases (Llama mlp_bias)
  bool qk_norm = false;   // per-head RMSNorm on q and k before RoPE (Qwen3 only)
  std::optional<std::int64_t> sliding_window;  // only when the config enables it

  std::vector<std::int64_t> bos_token_ids;  // config may give an int or a list
  std::vector<std::int64_t> eos_token_ids;
  std::string torch_dtype;  // "bfloat16", ... ("" when absent)
  // quantization_config says bitsandbytes 4-bit NF4 (model/bnb4.h): the projection weights are
  // stored as NF4 codes. Other quantisation configs are refused when the config is parsed.
  bool bnb_4bit = false;

  std::int64_t q_dim() const { return num_heads * head_dim; }
  std::int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses config.json text. `source` names the file in error messages. Throws UserError for an
// unsupported model_type (listing the supported ones), missing or inconsistent dimensions, an
// unsupported activation or RoPE type.
ModelConfig parse_model_config(std::string_view json_text, const std::string& source);

// Reads DIR/config.json (or the file itself when given a file).
ModelConfig load_model_config(const std::filesystem::path& dir_or_file);

const char* architecture_name(Architecture a);  // "qwen3", "qwen2", "llama", "mistral"

// ---- shapes and names ----

// The seven LoRA-targetable projections of a decoder layer, in PEFT's usual order.
enum class LinearKind { Q, K, V, O, Gate, Up, Down };
inline constexpr LinearKind kAllLinears[] = {LinearKind::Q,   LinearKind::K,    LinearKind::V,
                                             LinearKind::O,   LinearKind::Gate, LinearKind::Up,
                                             LinearKind::Down};

const char* linear_name(LinearKind k);    // "q_proj", ..., "down_proj"
const char* linear_module(LinearKind k);  // "self_attn" or "mlp"

struct LinearShape {
  std::int64_t out_features = 0;
  std::int64_t in_features = 0;
  bool bias = false;
};
LinearShape linear_shape(const ModelConfig& c, LinearKind k);

// "model.layers.{i}.self_attn.q_proj" etc. (add ".weight" / ".bias").
std::string linear_path(std::int64_t layer, LinearKind k);

// Every tensor the checkpoint must provide, with its shape. lm_head.weight is listed only when
// the model is untied; a tied checkpoint may carry it anyway (it is then ignored).
struct ExpectedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
};
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c);

struct ParameterCounts {
  std::int64_t embedding = 0;  // V*H
  std::int64_t lm_head = 0;    // V*H when untied, else 0 (shares the embedding)
  std::int64_t linear = 0;     // all layers' projection weights (what NF4 quantises)
  std::int64_t bias = 0;       // projection biases
  std::int64_t norm = 0;       // RMSNorm weights incl. q/k norms and the final norm
  std::int64_t total() const { return embedding + lm_head + linear + bias + norm; }
};
ParameterCounts count_parameters(const ModelConfig& c);

// LoRA parameters (A [r, in] + B [out, r]) over the given projections of every layer.
std::int64_t lora_parameter_count(const ModelConfig& c, std::int64_t rank,
                                  const std::vector<LinearKind>& targets);

// The seven projections with their shapes, for reading and writing PEFT adapters.
io::LoraTargetShapes lora_target_shapes(const ModelConfig& c);

// ---- RoPE ----

// inv_freq[j] for j < head_dim/2, in fp32 exactly as transformers computes it
// (T-RoPE _compute_default_rope_parameters; linear divides by factor; llama3 per formats.md §1.7).
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace forja::model
