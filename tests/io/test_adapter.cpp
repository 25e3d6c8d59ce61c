// PEFT adapters: adapter_config.json as PEFT writes it, write-then-read of the weights, BF16
// adapters, and every mismatch against the model rejected with a message naming the tensor.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/adapter.h"
#include "io/file_helpers.h"
#include "io/float16.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/config_fixtures.h"

namespace forja::io {
namespace {

using test::scratch_dir;
using test::user_error_of;

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << (msg)

// A two-layer model with Qwen3-0.6B's widths keeps the files small.
LoraTargetShapes tiny_shapes() {
  std::string cfg = test::qwen3_config(64, 96, 2, 8, true);
  return model::lora_target_shapes(model::parse_model_config(cfg, "config.json"));
}

Adapter random_adapter(const LoraTargetShapes& shapes, std::int64_t r,
                       const std::vector<std::string>& targets) {
  Adapter a;
  a.config.base_model_name_or_path = "Qwen/Qwen3-0.6B";
  a.config.r = r;
  a.config.lora_alpha = 16;
  a.config.lora_dropout = 0.05;
  a.config.target_modules = targets;
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0, 1);
  for (std::int64_t layer = 0; layer < shapes.num_layers; ++layer)
    for (const std::string& t : targets) {
      const LoraTarget* target = shapes.find(t);
      LoraWeights w{layer, t, std::vector<float>(r * target->in_features),
                    std::vector<float>(target->out_features * r)};
      for (float& x : w.a) x = n(rng);
      for (float& x : w.b) x = n(rng);
      a.weights.push_back(std::move(w));
    }
  return a;
}

TEST(AdapterConfig, WritesPeftFieldsSortedAndParsesBack) {
  LoraConfig c;
  c.base_model_name_or_path = "Qwen/Qwen3-8B";
  c.r = 16;
  c.lora_alpha = 32;
  c.target_modules = {"v_proj", "q_proj"};
  std::string text = adapter_config_json(c);
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 16);
  EXPECT_TRUE(j["lora_alpha"].is_number_integer());
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["target_modules"], (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(j["use_dora"], false);
  // Keys appear in sorted order in the text.
  std::vector<std::size_t> positions;
  for (auto it = j.begin(); it != j.end(); ++it)
    positions.push_back(text.find("\"" + it.key() + "\":"));
  EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end()));

  LoraConfig back = parse_adapter_config(text, "adapter_config.json");
  EXPECT_EQ(back.r, 16);
  EXPECT_EQ(back.lora_alpha, 32);
  EXPECT_EQ(back.base_model_name_or_path, "Qwen/Qwen3-8B");
  EXPECT_DOUBLE_EQ(back.scaling(), 2.0);
  back.use_rslora = true;
  EXPECT_DOUBLE_EQ(back.scaling(), 8.0);
}

TEST(AdapterConfig, RejectsUnsupportedFeatures) {
  auto base = nlohmann::json::parse(adapter_config_json(LoraConfig{.target_modules = {"q_proj"}}));
  auto err = [&](const std::string& key, nlohmann::json value) {
    auto j = base;
    j[key] = value;
    return user_error_of([&] { parse_adapter_config(j.dump(), "adapter_config.json"); });
  };
  EXPECT_HAS(err("use_dora", true), "DoRA");
  EXPECT_HAS(err("bias", "all"), "\"bias\"");
  EXPECT_HAS(err("rank_pattern", {{"q_proj", 4}}), "rank_pattern");
  EXPECT_HAS(err("modules_to_save", {"lm_head"}), "modules_to_save");
  EXPECT_HAS(err("layers_to_transform", {0, 1}), "layers_to_transform");
  EXPECT_HAS(err("peft_type", "IA3"), "LORA");
  EXPECT_HAS(err("target_modules", ".*proj"), "regular expression");
  EXPECT_HAS(err("r", 0), "\"r\" must be a positive integer");
  EXPECT_HAS(err("r", 0), "adapter_config.json");
}

TEST(AdapterFiles, WriteThenReadRoundTrip) {
  auto dir = scratch_dir();
  LoraTargetShapes shapes = tiny_shapes();
  Adapter a = random_adapter(
      shapes, 4, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  save_adapter(dir, a, shapes);

  auto file = SafetensorsFile::open(dir / "adapter_model.safetensors");
  EXPECT_EQ(file.tensors().size(), 2u * 7 * 2);
  const TensorInfo* qa =
      file.find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  ASSERT_NE(qa, nullptr);
  EXPECT_EQ(qa->dtype, Dtype::F32);
  EXPECT_EQ(qa->shape, (std::vector<std::int64_t>{4, 64}));
  const TensorInfo* db = file.find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(db->shape, (std::vector<std::int64_t>{64, 4}));
  const TensorInfo* ob =
      file.find("base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight");
  ASSERT_NE(ob, nullptr);
  EXPECT_EQ(ob->shape, (std::vector<std::int64_t>{4, 8 * 128}));  // o_proj in = nh * head_dim

  Adapter b = load_adapter(dir, shapes);
  EXPECT_EQ(b.config.r, 4);
  EXPECT_EQ(b.config.lora_dropout, 0.05);
  ASSERT_EQ(b.weights.size(), a.weights.size());
  for (std::size_t i = 0; i < a.weights.size(); ++i) {
    EXPECT_EQ(b.weights[i].layer, a.weights[i].layer);
    EXPECT_EQ(b.weights[i].target, a.weights[i].target);
    EXPECT_EQ(b.weights[i].a, a.weights[i].a);
    EXPECT_EQ(b.weights[i].b, a.weights[i].b);
  }
}

TEST(AdapterFiles, ReadsBf16AdapterAndAllLinear) {
  auto dir = scratch_dir();
  LoraTargetShapes shapes = tiny_shapes();
  // Write a BF16 adapter by hand, as PEFT does when autocast_adapter_dtype is off.
  std::vector<std::vector<std::uint16_t>> store;
  std::vector<TensorToWrite> tensors;
  for (int layer = 0; layer < 2; ++layer)
    for (const LoraTarget& t : shapes.targets) {
      store.emplace_back(2 * t.in_features, float_to_bf16(0.5f));
      tensors.push_back({lora_tensor_name(layer, t.module_path, 'A'),
                         Dtype::BF16,
                         {2, t.in_features},
                         std::as_bytes(std::span(store.back())),
                         {}});
      store.emplace_back(t.out_features * 2, float_to_bf16(-0.25f));
      tensors.push_back({lora_tensor_name(layer, t.module_path, 'B'),
                         Dtype::BF16,
                         {t.out_features, 2},
                         std::as_bytes(std::span(store.back())),
                         {}});
    }
  write_safetensors(dir / "adapter_model.safetensors", tensors);
  auto j = nlohmann::json::parse(adapter_config_json(LoraConfig{.r = 2}));
  j["target_modules"] = "all-linear";
  test::write_bytes(dir / "adapter_config.json", j.dump());
  Adapter a = load_adapter(dir, shapes);
  ASSERT_EQ(a.weights.size(), 14u);
  EXPECT_EQ(a.weights[0].target, "q_proj");
  EXPECT_EQ(a.weights[6].target, "down_proj");
  EXPECT_EQ(a.weights[3].a[0], 0.5f);
  EXPECT_EQ(a.weights[3].b[0], -0.25f);
}

TEST(AdapterFiles, RejectsMismatchesWithTheModel) {
  auto dir = scratch_dir();
  LoraTargetShapes shapes = tiny_shapes();
  save_adapter(dir, random_adapter(shapes, 4, {"q_proj", "v_proj"}), shapes);

  // A model with a different hidden size: A of q_proj no longer fits.
  LoraTargetShapes other = model::lora_target_shapes(
      model::parse_model_config(test::qwen3_config(128, 96, 2, 8, true), "config.json"));
  std::string msg = user_error_of([&] { load_adapter(dir, other); });
  EXPECT_HAS(msg, "adapter_model.safetensors");
  EXPECT_HAS(msg, "layers.0.self_attn.q_proj.lora_A.weight' has shape [4, 64]");
  EXPECT_HAS(msg, "[4, 128]");

  // A model with more layers: layer 2's factors are missing.
  LoraTargetShapes deeper = model::lora_target_shapes(
      model::parse_model_config(test::qwen3_config(64, 96, 3, 8, true), "config.json"));
  EXPECT_HAS(user_error_of([&] { load_adapter(dir, deeper); }),
             "missing tensor 'base_model.model.model.layers.2.");

  // adapter_config.json claiming fewer targets than the file holds: extra tensors.
  auto j = nlohmann::json::parse(std::ifstream(dir / "adapter_config.json"));
  j["target_modules"] = {"q_proj"};
  test::write_bytes(dir / "adapter_config.json", j.dump());
  EXPECT_HAS(user_error_of([&] { load_adapter(dir, shapes); }), "unexpected tensor");

  j["target_modules"] = {"lm_head"};
  test::write_bytes(dir / "adapter_config.json", j.dump());
  EXPECT_HAS(user_error_of([&] { load_adapter(dir, shapes); }), "target module \"lm_head\"");

  EXPECT_HAS(user_error_of([&] { load_adapter(dir / "nope", shapes); }),
             "adapter_config.json: not found");
}

}  // namespace
}  // namespace forja::io
