// NF4 for checkpoints (model/nf4.h): a bf16 tensor quantised straight from its mapped file gives
// the codec's result on the widened values; every projection of a checkpoint streamed in layer
// order; a weight whose shape config.json contradicts is named.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "io/file_helpers.h"
#include "io/float16.h"
#include "io/safetensors.h"
#include "model/config_fixtures.h"
#include "model/nf4.h"

namespace forja::model {
namespace {

TEST(Nf4Quantize, StreamsFromBf16Checkpoint) {
  auto dir = test::scratch_dir();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<std::uint16_t> bf16(96 * 130);
  std::vector<float> widened(bf16.size());
  for (std::size_t i = 0; i < bf16.size(); ++i) {
    bf16[i] = io::float_to_bf16(normal(rng));
    widened[i] = io::bf16_to_float(bf16[i]);
  }
  io::write_safetensors(dir / "w.safetensors",
                        {{"w", io::Dtype::BF16, {96, 130}, std::as_bytes(std::span(bf16)), {}}});
  auto file = io::SafetensorsFile::open(dir / "w.safetensors");
  quant::Nf4Tensor streamed = nf4_quantize_tensor(file.tensor("w"), {.double_quant = true, .threads = 4});
  quant::Nf4Tensor direct = quant::nf4_quantize(widened, {96, 130}, {.double_quant = true, .threads = 1});
  EXPECT_EQ(streamed.shape, (std::vector<std::int64_t>{96, 130}));
  EXPECT_EQ(streamed.packed, direct.packed);
  EXPECT_EQ(streamed.absmax_q, direct.absmax_q);
}


// A tiny Qwen3-shaped checkpoint in bf16, sharded, with every tensor config.json implies.
struct TinyCheckpoint {
  ModelConfig config;
  std::map<std::string, std::vector<std::uint16_t>> data;
};

TinyCheckpoint write_tiny_checkpoint(const std::filesystem::path& dir,
                                     const std::string& bad_tensor = "") {
  TinyCheckpoint ck;
  ck.config = parse_model_config(test::qwen3_config(64, 96, 2, 8, true), "config.json");
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<io::TensorToWrite> tensors;
  for (ExpectedTensor& t : expected_tensors(ck.config)) {
    if (t.name == bad_tensor) t.shape[0] += 1;
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    auto& v = ck.data[t.name];
    for (std::int64_t i = 0; i < n; ++i) v.push_back(io::float_to_bf16(normal(rng)));
    tensors.push_back({t.name, io::Dtype::BF16, t.shape, std::as_bytes(std::span(v)), {}});
  }
  io::write_safetensors_sharded(dir, tensors, 400'000);
  return ck;
}

TEST(Nf4Checkpoint, StreamsEveryLinearInLayerOrder) {
  auto dir = test::scratch_dir();
  TinyCheckpoint ck = write_tiny_checkpoint(dir);
  auto checkpoint = io::SafetensorsCheckpoint::open(dir);
  ASSERT_GT(checkpoint.files().size(), 1u);
  std::vector<std::string> names;
  quantize_checkpoint_linears(checkpoint, ck.config, {.double_quant = true, .threads = 2},
                              [&](const std::string& name, quant::Nf4Tensor&& t) {
                                names.push_back(name);
                                std::vector<float> widened;
                                for (auto h : ck.data.at(name))
                                  widened.push_back(io::bf16_to_float(h));
                                quant::Nf4Tensor direct = quant::nf4_quantize(
                                    widened, t.shape, {.double_quant = true, .threads = 1});
                                EXPECT_EQ(t.packed, direct.packed) << name;
                                EXPECT_EQ(t.absmax_q, direct.absmax_q) << name;
                              });
  ASSERT_EQ(names.size(), 14u);
  EXPECT_EQ(names[0], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names[6], "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(names[13], "model.layers.1.mlp.down_proj.weight");
}

TEST(Nf4Checkpoint, ShapeMismatchNamesTensor) {
  auto dir = test::scratch_dir();
  TinyCheckpoint ck = write_tiny_checkpoint(dir, "model.layers.1.self_attn.k_proj.weight");
  auto checkpoint = io::SafetensorsCheckpoint::open(dir);
  std::string msg = test::user_error_of([&] {
    quantize_checkpoint_linears(checkpoint, ck.config, {}, [](const std::string&, quant::Nf4Tensor&&) {});
  });
  EXPECT_NE(msg.find("'model.layers.1.self_attn.k_proj.weight' has shape [1025, 64]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("implies [1024, 64]"), std::string::npos) << msg;
}

}  // namespace
}  // namespace forja::model
