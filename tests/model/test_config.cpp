// ModelConfig: config.json of each supported family, parameter totals against the figures in
// docs/formats.md, RoPE tables against an independent double-precision formula, and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "io/file_helpers.h"
#include "model/config.h"
#include "model/config_fixtures.h"
#include "util/error.h"

namespace forja::model {
namespace {

using test::user_error_of;

ModelConfig parse(const std::string& text) { return parse_model_config(text, "config.json"); }

// A config with one key replaced (or added) by a raw JSON value.
std::string with(std::string text, const std::string& key, const std::string& value) {
  const std::string needle = "\"" + key + "\":";
  auto pos = text.find(needle);
  if (pos == std::string::npos) return "{" + needle + value + "," + text.substr(1);
  auto start = pos + needle.size();
  int depth = 0;
  auto end = start;
  for (; end < text.size(); ++end) {
    char ch = text[end];
    if (ch == '{' || ch == '[') ++depth;
    if (ch == '}' || ch == ']') {
      if (depth == 0) break;
      --depth;
    }
    if (ch == ',' && depth == 0) break;
  }
  return text.substr(0, start) + value + text.substr(end);
}

std::string without(std::string text, const std::string& key) {
  std::string s = with(text, key, "null");
  auto pos = s.find("\"" + key + "\":null");
  s.erase(pos, key.size() + 7);
  if (s[pos] == ',')
    s.erase(pos, 1);
  else if (s[pos - 1] == ',')
    s.erase(pos - 1, 1);
  return s;
}

TEST(ModelConfig, Qwen3Fields) {
  ModelConfig c = parse(test::qwen3_0_6b());
  EXPECT_EQ(c.architecture, Architecture::Qwen3);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 2048);  // nh * d != H for Qwen3-0.6B
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeType::Default);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.bos_token_ids, (std::vector<std::int64_t>{151643}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{151645}));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(linear_shape(c, LinearKind::O).in_features, 2048);
  // Qwen3 without head_dim falls back to the class default 128, not H / nh.
  EXPECT_EQ(parse(without(test::qwen3_0_6b(), "head_dim")).head_dim, 128);
}

TEST(ModelConfig, ParameterTotalsMatchFormatsDoc) {
  EXPECT_EQ(count_parameters(parse(test::qwen3_0_6b())).total(), 596'049'920);
  EXPECT_EQ(count_parameters(parse(test::qwen3_1_7b())).total(), 1'720'574'976);
  EXPECT_EQ(count_parameters(parse(test::qwen3_4b())).total(), 4'022'468'096);
  EXPECT_EQ(count_parameters(parse(test::qwen3_8b())).total(), 8'190'735'360);
  // Published sizes of other families.
  EXPECT_EQ(count_parameters(parse(test::qwen2_5_0_5b())).total(), 494'032'768);
  EXPECT_EQ(count_parameters(parse(test::llama3_1_8b())).total(), 8'030'261'248);
  EXPECT_EQ(count_parameters(parse(test::mistral_7b())).total(), 7'241'732'096);
}

TEST(ModelConfig, LoraCountsMatchFormatsDoc) {
  std::vector<LinearKind> all(std::begin(kAllLinears), std::end(kAllLinears));
  // formats.md §4.3: r = 16 on all seven projections: 0.6B 10.1 M, 4B 33.0 M, 8B 43.6 M.
  EXPECT_NEAR(lora_parameter_count(parse(test::qwen3_0_6b()), 16, all) / 1e6, 10.1, 0.05);
  EXPECT_NEAR(lora_parameter_count(parse(test::qwen3_4b()), 16, all) / 1e6, 33.0, 0.05);
  EXPECT_NEAR(lora_parameter_count(parse(test::qwen3_8b()), 16, all) / 1e6, 43.6, 0.05);
}

TEST(ModelConfig, ExpectedTensorNames) {
  ModelConfig c = parse(test::qwen3_0_6b());
  auto tensors = expected_tensors(c);
  EXPECT_EQ(tensors.size(), 28u * 11 + 2);  // tied: no lm_head.weight required
  EXPECT_EQ(tensors.front().name, "model.embed_tokens.weight");
  bool found = false;
  for (auto& t : tensors)
    if (t.name == "model.layers.3.self_attn.k_proj.weight") {
      found = true;
      EXPECT_EQ(t.shape, (std::vector<std::int64_t>{1024, 1024}));
    }
  EXPECT_TRUE(found);
  EXPECT_EQ(expected_tensors(parse(test::qwen3_8b())).back().name, "lm_head.weight");
}

TEST(ModelConfig, Qwen2HasQkvBiasesAndNoQkNorm) {
  ModelConfig c = parse(test::qwen2_5_0_5b());
  EXPECT_EQ(c.architecture, Architecture::Qwen2);
  EXPECT_EQ(c.head_dim, 64);  // derived: 896 / 14
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window is false
  int biases = 0;
  for (auto& t : expected_tensors(c)) biases += t.name.ends_with(".bias");
  EXPECT_EQ(biases, 24 * 3);
}

TEST(ModelConfig, LlamaWithLlama3Rope) {
  ModelConfig c = parse(test::llama3_1_8b());
  EXPECT_EQ(c.architecture, Architecture::Llama);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeType::Llama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{128001, 128008, 128009}));
}

TEST(ModelConfig, MistralDefaults) {
  ModelConfig c = parse(test::mistral_7b());
  EXPECT_EQ(c.architecture, Architecture::Mistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(parse(with(test::mistral_7b(), "sliding_window", "null")).sliding_window, std::nullopt);
  EXPECT_EQ(parse(without(test::mistral_7b(), "num_key_value_heads")).num_kv_heads, 8);
}

TEST(ModelConfig, RopeThetaInEveryPlace) {
  std::string base = without(test::qwen3_0_6b(), "rope_theta");
  EXPECT_EQ(parse(base).rope_theta, 10000.0);  // transformers' fallback
  EXPECT_EQ(parse(with(base, "rope_scaling", R"({"rope_type":"default","rope_theta":5000000})"))
                .rope_theta,
            5e6);
  EXPECT_EQ(parse(with(base, "rope_parameters", R"({"rope_type":"default","rope_theta":250000.0})"))
                .rope_theta,
            250000.0);
  ModelConfig lin = parse(with(base, "rope_scaling", R"({"type":"linear","factor":2.0})"));
  EXPECT_EQ(lin.rope_scaling.type, RopeType::Linear);
  EXPECT_EQ(lin.rope_scaling.factor, 2.0);
  ModelConfig l3 = parse(with(
      without(test::llama3_1_8b(), "rope_scaling"), "rope_parameters",
      R"({"rope_type":"llama3","rope_theta":500000.0,"factor":32.0,)"
      R"("low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192})"));
  EXPECT_EQ(l3.rope_scaling.type, RopeType::Llama3);
  EXPECT_EQ(l3.rope_scaling.factor, 32.0);
  EXPECT_EQ(l3.rope_theta, 500000.0);
}

TEST(ModelConfig, InvFreqDefaultAndLinear) {
  ModelConfig c = parse(test::qwen3_0_6b());
  auto inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 64u);
  for (int j = 0; j < 64; ++j) {
    double expect = 1.0 / std::pow(1e6, 2.0 * j / 128.0);
    EXPECT_NEAR(inv[j], expect, expect * 1e-6) << j;
  }
  c.rope_scaling.type = RopeType::Linear;
  c.rope_scaling.factor = 4.0;
  auto lin = rope_inv_freq(c);
  for (int j = 0; j < 64; ++j) EXPECT_FLOAT_EQ(lin[j], inv[j] / 4.0f);
}

TEST(ModelConfig, InvFreqLlama3Regimes) {
  ModelConfig c = parse(test::llama3_1_8b());
  auto inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 64u);
  int high = 0, low = 0, mid = 0;
  for (int j = 0; j < 64; ++j) {
    // Independent double-precision statement of formats.md §1.7.
    double f = 1.0 / std::pow(500000.0, 2.0 * j / 128.0);
    double wavelen = 2 * std::numbers::pi / f;
    double expect;
    if (wavelen < 8192.0 / 4.0) {
      expect = f;
      ++high;
    } else if (wavelen > 8192.0 / 1.0) {
      expect = f / 8.0;
      ++low;
    } else {
      double s = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      expect = (1 - s) * f / 8.0 + s * f;
      ++mid;
    }
    EXPECT_NEAR(inv[j], expect, expect * 2e-6) << j;
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
}

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << (msg)

TEST(ModelConfig, UnknownModelTypeListsSupported) {
  std::string msg =
      user_error_of([] { parse(with(test::qwen3_0_6b(), "model_type", "\"gemma3\"")); });
  EXPECT_HAS(msg, "config.json");
  EXPECT_HAS(msg, "\"gemma3\" is not supported");
  EXPECT_HAS(msg, "qwen3, qwen2, llama, mistral");
  EXPECT_HAS(user_error_of([] { parse(without(test::qwen3_0_6b(), "model_type")); }),
             "no \"model_type\"");
}

TEST(ModelConfig, RejectsBadConfigs) {
  EXPECT_HAS(user_error_of([] { parse(without(test::qwen3_0_6b(), "hidden_size")); }),
             "missing \"hidden_size\"");
  EXPECT_HAS(user_error_of([] { parse(with(test::qwen3_0_6b(), "num_key_value_heads", "5")); }),
             "not a multiple of num_key_value_heads");
  EXPECT_HAS(user_error_of([] { parse(with(test::qwen3_0_6b(), "hidden_size", "\"1024\"")); }),
             "\"hidden_size\" must be an integer");
  EXPECT_HAS(user_error_of([] { parse(with(test::qwen3_0_6b(), "hidden_act", "\"gelu\"")); }),
             "\"gelu\"");
  EXPECT_HAS(
      user_error_of([] {
        parse(with(test::qwen3_0_6b(), "rope_scaling", R"({"rope_type":"yarn","factor":4.0})"));
      }),
      "RoPE type \"yarn\" is not supported");
  EXPECT_HAS(user_error_of([] {
               parse(with(test::llama3_1_8b(), "rope_scaling", R"({"rope_type":"llama3"})"));
             }),
             "needs \"factor\"");
  EXPECT_HAS(user_error_of([] { parse(with(test::qwen3_0_6b(), "head_dim", "7")); }), "even");
  // Sizes beyond any model are a damaged file (fuzz: model_config regress_layers_beyond_any_model),
  // refused before anything is sized from them; the largest accepted still parses.
  EXPECT_HAS(user_error_of([] { parse(with(test::qwen3_0_6b(), "num_hidden_layers", "777777772")); }),
             "\"num_hidden_layers\" is 777777772, beyond the 4096");
  EXPECT_HAS(user_error_of([] { parse(with(test::qwen3_0_6b(), "vocab_size", "16777217")); }), "damaged");
  EXPECT_HAS(user_error_of([] { parse(with(test::qwen3_0_6b(), "head_dim", "32768")); }), "damaged");
  EXPECT_EQ(parse(with(test::qwen3_0_6b(), "num_hidden_layers", "4096")).num_layers, 4096);
  EXPECT_HAS(user_error_of([] { parse(R"({"model_type":"qwen3","model_type":"llama"})"); }),
             "duplicate key");
  EXPECT_HAS(user_error_of([] { parse("[1]"); }), "must be a JSON object");
  EXPECT_HAS(user_error_of([] { load_model_config("/nonexistent/model"); }),
             "/nonexistent/model: not found");
}

}  // namespace
}  // namespace forja::model
