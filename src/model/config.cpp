// config.json -> ModelConfig, and what the config alone determines (shapes, names, counts,
// RoPE frequencies). Field meanings and defaults: docs/formats.md §1.1 and §1.7.
#include "model/config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <tuple>

#include "io/json_file.h"
#include "model/bnb4.h"
#include "util/error.h"

namespace forja::model {
namespace {

using json = nlohmann::json;

constexpr const char* kSupported = "qwen3, qwen2, llama, mistral";

class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), source_(source) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw UserError(source_ + ": " + problem);
  }

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  std::int64_t integer(const char* key) const {
    if (!has(key))
      fail(std::string("missing \"") + key +
           "\"; config.json of a Hugging Face model always has it");
    return integer_value(j_.at(key), key);
  }
  std::int64_t integer(const char* key, std::int64_t fallback) const {
    return has(key) ? integer_value(j_.at(key), key) : fallback;
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_number())
      fail(std::string("\"") + key + "\" must be a number, got " + j_.at(key).dump());
    return j_.at(key).get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_boolean())
      fail(std::string("\"") + key + "\" must be true or false, got " + j_.at(key).dump());
    return j_.at(key).get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_string())
      fail(std::string("\"") + key + "\" must be a string, got " + j_.at(key).dump());
    return j_.at(key).get<std::string>();
  }
  std::vector<std::int64_t> token_ids(const char* key) const {
    if (!has(key)) return {};
    const json& v = j_.at(key);
    if (v.is_array()) {
      std::vector<std::int64_t> out;
      for (const json& e : v) out.push_back(integer_value(e, key));
      return out;
    }
    return {integer_value(v, key)};
  }

 private:
  std::int64_t integer_value(const json& v, const char* key) const {
    if (!v.is_number_integer())
      fail(std::string("\"") + key + "\" must be an integer, got " + v.dump());
    return v.get<std::int64_t>();
  }
  const json& j_;
  const std::string& source_;
};

// RoPE settings: rope_theta at the top level, or inside rope_scaling / rope_parameters (newer
// transformers), with the type under "rope_type" or the older "type".
void read_rope(const json& j, const Reader& top, const std::string& source, ModelConfig& c) {
  c.rope_theta = top.number("rope_theta", 10000.0);
  const json* dict = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    dict = &j["rope_parameters"];
    // Models with several attention kinds keep one dict per kind; these use full attention.
    if (dict->contains("full_attention") && (*dict)["full_attention"].is_object())
      dict = &(*dict)["full_attention"];
  } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    dict = &j["rope_scaling"];
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    top.fail("\"rope_scaling\" must be an object or null, got " + j["rope_scaling"].dump());
  }
  if (!dict) return;
  Reader r(*dict, source);
  c.rope_theta = r.number("rope_theta", c.rope_theta);
  std::string type = r.string("rope_type", r.string("type", "default"));
  if (type == "default") {
    c.rope_scaling.type = RopeType::Default;
  } else if (type == "linear") {
    c.rope_scaling.type = RopeType::Linear;
    if (!r.has("factor")) top.fail("rope scaling \"linear\" needs a \"factor\"");
    c.rope_scaling.factor = r.number("factor", 1.0);
  } else if (type == "llama3") {
    c.rope_scaling.type = RopeType::Llama3;
    for (const char* key :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!r.has(key)) top.fail(std::string("rope scaling \"llama3\" needs \"") + key + "\"");
    c.rope_scaling.factor = r.number("factor", 1.0);
    c.rope_scaling.low_freq_factor = r.number("low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = r.number("high_freq_factor", 4.0);
    c.rope_scaling.original_max_position_embeddings = r.integer("original_max_position_embeddings");
    if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor))
      top.fail("rope scaling \"llama3\" needs high_freq_factor > low_freq_factor");
  } else {
    top.fail("RoPE type \"" + type +
             "\" is not supported (forja supports default, linear and llama3); "
             "remove the rope scaling entry or use a model without it");
  }
  if (c.rope_scaling.factor <= 0) top.fail("rope scaling \"factor\" must be positive");
}

}  // namespace

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::Qwen3:
      return "qwen3";
    case Architecture::Qwen2:
      return "qwen2";
    case Architecture::Llama:
      return "llama";
    case Architecture::Mistral:
      return "mistral";
  }
  return "?";
}

ModelConfig parse_model_config(std::string_view json_text, const std::string& source) {
  const json j = io::parse_json_strict(json_text, source);
  if (!j.is_object()) throw UserError(source + ": config.json must be a JSON object");
  Reader r(j, source);
  ModelConfig c;
  c.model_type = r.string("model_type", "");
  if (c.model_type == "qwen3") {
    c.architecture = Architecture::Qwen3;
  } else if (c.model_type == "qwen2") {
    c.architecture = Architecture::Qwen2;
  } else if (c.model_type == "llama") {
    c.architecture = Architecture::Llama;
  } else if (c.model_type == "mistral") {
    c.architecture = Architecture::Mistral;
  } else {
    r.fail((c.model_type.empty() ? std::string("no \"model_type\"")
                                 : "model_type \"" + c.model_type + "\" is not supported") +
           "; forja supports " + kSupported);
  }
  const Architecture a = c.architecture;

  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_layers = r.integer("num_hidden_layers");
  c.num_heads = r.integer("num_attention_heads");
  // Absent or null means "as many as query heads", except Mistral's class default of 8 (T-MC).
  c.num_kv_heads =
      r.integer("num_key_value_heads",
                a == Architecture::Mistral && !j.contains("num_key_value_heads") ? 8 : c.num_heads);
  for (auto [key, v] : {std::pair{"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_layers},
                        {"num_attention_heads", c.num_heads},
                        {"num_key_value_heads", c.num_kv_heads}})
    if (v <= 0) r.fail(std::string("\"") + key + "\" must be positive, got " + std::to_string(v));
  // Upper bounds far beyond any released model, so a damaged file is refused here rather than
  // sizing tensor lists, parameter counts (int64 products) or buffers from a wild number: the
  // model_config fuzz target found num_hidden_layers 777777772 building a 2 GB tensor list.
  for (auto [key, v, most] : {std::tuple{"vocab_size", c.vocab_size, std::int64_t{1} << 24},
                              {"hidden_size", c.hidden_size, std::int64_t{1} << 20},
                              {"intermediate_size", c.intermediate_size, std::int64_t{1} << 22},
                              {"num_hidden_layers", c.num_layers, std::int64_t{1} << 12},
                              {"num_attention_heads", c.num_heads, std::int64_t{1} << 14},
                              {"num_key_value_heads", c.num_kv_heads, std::int64_t{1} << 14}})
    if (v > most)
      r.fail(std::string("\"") + key + "\" is " + std::to_string(v) + ", beyond the " + std::to_string(most) +
             " forja accepts (no model has that many): the file is damaged");
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_attention_heads (" + std::to_string(c.num_heads) +
           ") is not a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) + ")");

  if (r.has("head_dim")) {
    c.head_dim = r.integer("head_dim");
  } else if (a == Architecture::Qwen3) {
    c.head_dim = 128;  // T-Q3C class default; Qwen3 configs write it explicitly
  } else {
    if (c.hidden_size % c.num_heads != 0)
      r.fail("hidden_size is not a multiple of num_attention_heads and no \"head_dim\" is given");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    r.fail("head_dim must be positive and even for RoPE, got " + std::to_string(c.head_dim));
  if (c.head_dim > (std::int64_t{1} << 14))
    r.fail("head_dim is " + std::to_string(c.head_dim) + ", beyond the 16384 forja accepts: the file is damaged");

  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu")
    r.fail("hidden_act \"" + act + "\" is not supported; these architectures use \"silu\"");

  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) r.fail("rms_norm_eps must be positive");
  read_rope(j, r, source, c);
  if (!(c.rope_theta > 0)) r.fail("rope_theta must be positive");

  const std::int64_t default_max_pos = a == Architecture::Llama     ? 2048
                                       : a == Architecture::Mistral ? 4096 * 32
                                                                    : 32768;
  c.max_position_embeddings = r.integer("max_position_embeddings", default_max_pos);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);

  switch (a) {
    case Architecture::Qwen2:  // biases hard-coded on q/k/v, off on o_proj (T-Q2)
      c.qkv_bias = true;
      break;
    case Architecture::Qwen3:
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      c.qk_norm = true;
      break;
    case Architecture::Llama:
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      c.mlp_bias = r.boolean("mlp_bias", false);
      break;
    case Architecture::Mistral:
      break;
  }

  if (a == Architecture::Mistral) {
    if (!j.contains("sliding_window"))
      c.sliding_window = 4096;
    else if (r.has("sliding_window"))
      c.sliding_window = r.integer("sliding_window");
  } else if ((a == Architecture::Qwen3 || a == Architecture::Qwen2) &&
             r.boolean("use_sliding_window", false)) {
    c.sliding_window = r.integer("sliding_window", 4096);
  }

  c.bos_token_ids = r.token_ids("bos_token_id");
  c.eos_token_ids = r.token_ids("eos_token_id");
  c.torch_dtype = r.string("torch_dtype", r.string("dtype", ""));
  c.bnb_4bit = parse_quantization_config(j, source).has_value();
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir_or_file) {
  std::error_code ec;
  std::filesystem::path path =
      std::filesystem::is_directory(dir_or_file, ec) ? dir_or_file / "config.json" : dir_or_file;
  if (!std::filesystem::exists(path, ec))
    throw UserError(path.string() +
                    ": not found; --model must be a Hugging Face model directory "
                    "holding config.json and the safetensors weights");
  return parse_model_config(io::read_text_file(path), path.string());
}

// ---- shapes and names ----

const char* linear_name(LinearKind k) {
  switch (k) {
    case LinearKind::Q:
      return "q_proj";
    case LinearKind::K:
      return "k_proj";
    case LinearKind::V:
      return "v_proj";
    case LinearKind::O:
      return "o_proj";
    case LinearKind::Gate:
      return "gate_proj";
    case LinearKind::Up:
      return "up_proj";
    case LinearKind::Down:
      return "down_proj";
  }
  return "?";
}

const char* linear_module(LinearKind k) {
  return k == LinearKind::Gate || k == LinearKind::Up || k == LinearKind::Down ? "mlp"
                                                                               : "self_attn";
}

LinearShape linear_shape(const ModelConfig& c, LinearKind k) {
  switch (k) {
    case LinearKind::Q:
      return {c.q_dim(), c.hidden_size, c.qkv_bias};
    case LinearKind::K:
      return {c.kv_dim(), c.hidden_size, c.qkv_bias};
    case LinearKind::V:
      return {c.kv_dim(), c.hidden_size, c.qkv_bias};
    case LinearKind::O:
      return {c.hidden_size, c.q_dim(), c.o_bias};
    case LinearKind::Gate:
      return {c.intermediate_size, c.hidden_size, c.mlp_bias};
    case LinearKind::Up:
      return {c.intermediate_size, c.hidden_size, c.mlp_bias};
    case LinearKind::Down:
      return {c.hidden_size, c.intermediate_size, c.mlp_bias};
  }
  return {};
}

std::string linear_path(std::int64_t layer, LinearKind k) {
  return "model.layers." + std::to_string(layer) + "." + linear_module(k) + "." + linear_name(k);
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    out.push_back({layer + "input_layernorm.weight", {c.hidden_size}});
    out.push_back({layer + "post_attention_layernorm.weight", {c.hidden_size}});
    if (c.qk_norm) {
      out.push_back({layer + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({layer + "self_attn.k_norm.weight", {c.head_dim}});
    }
    for (LinearKind k : kAllLinears) {
      LinearShape s = linear_shape(c, k);
      out.push_back({linear_path(i, k) + ".weight", {s.out_features, s.in_features}});
      if (s.bias) out.push_back({linear_path(i, k) + ".bias", {s.out_features}});
    }
  }
  out.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return out;
}

ParameterCounts count_parameters(const ModelConfig& c) {
  ParameterCounts p;
  p.embedding = c.vocab_size * c.hidden_size;
  p.lm_head = c.tie_word_embeddings ? 0 : p.embedding;
  for (LinearKind k : kAllLinears) {
    LinearShape s = linear_shape(c, k);
    p.linear += c.num_layers * s.out_features * s.in_features;
    if (s.bias) p.bias += c.num_layers * s.out_features;
  }
  p.norm = c.num_layers * (2 * c.hidden_size + (c.qk_norm ? 2 * c.head_dim : 0)) + c.hidden_size;
  return p;
}

std::int64_t lora_parameter_count(const ModelConfig& c, std::int64_t rank,
                                  const std::vector<LinearKind>& targets) {
  std::int64_t per_layer = 0;
  for (LinearKind k : targets) {
    LinearShape s = linear_shape(c, k);
    per_layer += rank * (s.in_features + s.out_features);
  }
  return per_layer * c.num_layers;
}

io::LoraTargetShapes lora_target_shapes(const ModelConfig& c) {
  io::LoraTargetShapes out;
  out.num_layers = c.num_layers;
  for (LinearKind k : kAllLinears) {
    LinearShape s = linear_shape(c, k);
    out.targets.push_back({linear_name(k), std::string(linear_module(k)) + "." + linear_name(k),
                           s.in_features, s.out_features});
  }
  return out;
}

// ---- RoPE ----

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  // All arithmetic in fp32, in transformers' order, so the table matches it to the last bit
  // (up to the platform's powf).
  const std::int64_t dim = c.head_dim;
  const float base = static_cast<float>(c.rope_theta);
  std::vector<float> inv(static_cast<std::size_t>(dim / 2));
  for (std::int64_t j = 0; j < dim / 2; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(dim);
    inv[static_cast<std::size_t>(j)] = 1.0f / std::pow(base, exponent);
  }
  const RopeScaling& s = c.rope_scaling;
  const float factor = static_cast<float>(s.factor);
  if (s.type == RopeType::Linear) {
    for (float& f : inv) f = f / factor;
  } else if (s.type == RopeType::Llama3) {
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const float low_wavelen = static_cast<float>(old_len / s.low_freq_factor);
    const float high_wavelen = static_cast<float>(old_len / s.high_freq_factor);
    const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
    const float low = static_cast<float>(s.low_freq_factor);
    const float span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
    for (float& f : inv) {
      const float wavelen = two_pi / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;  // low frequencies: divided by factor
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        // Between the two wavelengths: blend the divided and the original frequency.
        const float smooth = (static_cast<float>(old_len) / wavelen - low) / span;
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
  }
  return inv;
}

}  // namespace forja::model
