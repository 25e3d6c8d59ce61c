// The training engine against the independent PyTorch reference (tests/reference): for small
// random Qwen3 / Qwen2 / Llama / Mistral models in the Hugging Face layout, forja's loss and
// every LoRA gradient of the first step, and the losses of 20 AdamW steps, must match the
// reference's float64 results to 1e-4 relative (fp32 engine, dense base weights).
//
// The cases (models, batches and reference outputs) are made at test time by
// tests/reference/parity_cases.py with Debian's python3-torch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/adapter.h"
#include "io/safetensors.h"
#include "model/base_weights.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "support/gpu_fixture.h"
#include "train/optimizer.h"

namespace forja::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  return json::parse(f);
}

// Generates the parity cases once per test process.
const fs::path& parity_dir() {
  static const fs::path dir = [] {
    // FORJA_PARITY_DIR: cases made elsewhere (e.g. carried to a GPU machine without the build tree).
    const char* env = std::getenv("FORJA_PARITY_DIR");
    fs::path d = env && *env ? fs::path(env) : fs::path(FORJA_BINARY_DIR) / "parity_cases";
    if (!fs::exists(d / "done")) {
      fs::remove_all(d);
      const std::string cmd = "/usr/bin/python3 " + std::string(FORJA_SOURCE_DIR) +
                              "/tests/reference/parity_cases.py --out " + d.string() + " > " + d.string() + ".log 2>&1";
      if (std::system(cmd.c_str()) != 0)
        throw std::runtime_error("parity_cases.py failed (python3-torch installed? see " + d.string() + ".log)");
      std::ofstream(d / "done") << "ok\n";
    }
    return d;
  }();
  return dir;
}

std::vector<model::TokenBatch> read_batches(const fs::path& p) {
  json j = read_json(p);
  std::vector<model::TokenBatch> out;
  for (const json& mb : j.at("micro_batches")) {
    model::TokenBatch b;
    const auto& ids = mb.at("input_ids");
    b.batch = static_cast<uint32_t>(ids.size());
    b.seq = static_cast<uint32_t>(ids[0].size());
    for (uint32_t r = 0; r < b.batch; ++r)
      for (uint32_t t = 0; t < b.seq; ++t) {
        b.input_ids.push_back(ids[r][t].get<int32_t>());
        // the target of position t is the label of t + 1 (the loss shifts inside)
        b.targets.push_back(t + 1 < b.seq ? mb.at("labels")[r][t + 1].get<int32_t>() : -100);
        b.positions.push_back(mb.contains("position_ids") ? mb["position_ids"][r][t].get<int32_t>() : int32_t(t));
        b.segments.push_back(mb.contains("segment_ids") ? mb["segment_ids"][r][t].get<int32_t>() : 1);
      }
    out.push_back(std::move(b));
  }
  return out;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

class Parity : public GpuTest, public ::testing::WithParamInterface<std::tuple<std::string, bool>> {};

TEST_P(Parity, LossGradientsAndTwentyStepsMatchPyTorch) {
  const auto& [name, checkpointing] = GetParam();
  const fs::path dir = parity_dir() / name;
  const json run = read_json(dir / "ref" / "run.json");

  const model::ModelConfig config = model::load_model_config(dir / "model");
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir / "model");
  model::BaseWeightOptions bo;
  bo.quant = model::BaseQuant::none;
  bo.dense_dtype = ops::DType::f32;
  model::BaseWeights base = model::load_base_weights(ctx(), ck, config, bo);

  const io::LoraTargetShapes shapes = model::lora_target_shapes(config);
  const io::Adapter initial = io::load_adapter(dir / "ref" / "initial_adapter", shapes);
  model::LoraSet lora(ctx(), config, model::LoraSettings::from_peft(initial.config));
  lora.load(initial);

  std::vector<model::TokenBatch> batches = read_batches(dir / "batch.json");
  uint32_t max_b = 0, max_s = 0;
  for (const auto& b : batches) {
    max_b = std::max(max_b, b.batch);
    max_s = std::max(max_s, b.seq);
  }
  model::Transformer tf(ctx(), base, lora, max_b, max_s, checkpointing);

  train::OptimizerSettings os;
  os.lr = run.at("lr").get<double>();
  os.beta1 = run.at("betas")[0].get<double>();
  os.beta2 = run.at("betas")[1].get<double>();
  os.eps = run.at("eps").get<double>();
  os.weight_decay = run.at("weight_decay").get<double>();
  os.max_grad_norm = run.at("max_grad_norm").get<double>();
  os.schedule = train::parse_schedule(run.at("schedule").get<std::string>());
  os.warmup_steps = run.at("warmup").get<int64_t>();
  os.total_steps = run.at("steps").get<int64_t>();
  train::AdamW adamw(ctx(), lora, os);
  const int64_t accum = run.at("grad_accum").get<int64_t>();

  gpu::Buffer loss_sum = ctx().alloc(16);
  const std::vector<double> ref_losses = read_json(dir / "ref" / "losses.json").at("losses").get<std::vector<double>>();
  std::vector<double> losses;
  for (int64_t step = 0; step < os.total_steps; ++step) {
    std::vector<const model::TokenBatch*> mbs;
    uint64_t n = 0;
    for (int64_t j = 0; j < accum; ++j) {
      mbs.push_back(&batches[(step * accum + j) % batches.size()]);
      n += mbs.back()->target_count();
    }
    lora.zero_grads();
    ctx().fill(loss_sum, 0);
    for (const auto* mb : mbs) tf.run(*mb, static_cast<float>(1.0 / double(n)), loss_sum, true);
    losses.push_back(ctx().download<float>(loss_sum, 1)[0] / double(n));

    if (step == 0) {
      // Every LoRA gradient of step 0 against the reference.
      const io::SafetensorsFile ref = io::SafetensorsFile::open(dir / "ref" / "step0_grads.safetensors");
      const std::vector<float> grads = ctx().download<float>(lora.grads(), lora.parameter_count());
      for (const model::LoraSlot& s : lora.slots()) {
        const std::string module = std::string(model::linear_module(s.kind)) + "." + model::linear_name(s.kind);
        for (char which : {'A', 'B'}) {
          const std::string key = io::lora_tensor_name(s.layer, module, which);
          const uint64_t off = which == 'A' ? s.a_offset : s.b_offset;
          const uint64_t len = which == 'A' ? uint64_t(s.rank) * s.in : uint64_t(s.out) * s.rank;
          std::vector<float> got(grads.begin() + off, grads.begin() + off + len);
          const std::vector<float> want = ref.tensor(key).to_float();
          ASSERT_EQ(got.size(), want.size()) << key;
          EXPECT_LT(rel_error(got, want), 1e-4) << key;
        }
      }
    }
    adamw.step(step);
  }
  ctx().free(loss_sum);
  ASSERT_EQ(losses.size(), ref_losses.size());
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], ref_losses[i], 1e-4 * std::abs(ref_losses[i])) << "step " << i;
  model::free_base_weights(ctx(), base);
}

INSTANTIATE_TEST_SUITE_P(Cases, Parity,
                         ::testing::Combine(::testing::Values("qwen3-tied", "qwen3-gqa-bf16", "qwen2-packed",
                                                              "llama3-rope-bias", "mistral-subset"),
                                            ::testing::Values(false)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + (std::get<1>(info.param) ? "_ckpt" : "");
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

INSTANTIATE_TEST_SUITE_P(Checkpointing, Parity,
                         ::testing::Values(std::make_tuple(std::string("qwen3-gqa-bf16"), true)),
                         [](const auto&) { return std::string("qwen3_gqa_bf16_ckpt"); });

}  // namespace
}  // namespace forja::test
