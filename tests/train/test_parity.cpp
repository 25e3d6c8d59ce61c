// The training engine against the independent PyTorch reference (tests/reference): for small
// random Qwen3 / Qwen2 / Llama / Mistral models in the Hugging Face layout, forja's loss and
// every LoRA gradient of the first step, and the losses of 20 AdamW steps, must match the
// reference's float64 results to 1e-4 relative (fp32 engine, dense base weights). qwen3-dropout
// trains with LoRA dropout p = 0.1, the reference applying forja's hash masks.
//
// The cases (models, batches and reference outputs) are made at test time by
// tests/reference/parity_cases.py with Debian's python3-torch (train/parity_support.h).
#include <gtest/gtest.h>

#include <cmath>

#include "io/adapter.h"
#include "io/safetensors.h"
#include "model/base_weights.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "support/gpu_fixture.h"
#include "train/parity_support.h"

namespace forja::test {
namespace {

namespace fs = std::filesystem;

class Parity : public GpuTest, public ::testing::WithParamInterface<std::tuple<std::string, bool>> {};

void check_case(gpu::Context& ctx, const std::string& name, bool checkpointing,
                const model::TransformerOptions& options = {}) {
  const fs::path dir = parity_case_dir(name);

  const model::ModelConfig config = model::load_model_config(dir / "model");
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir / "model");
  model::BaseWeightOptions bo;
  bo.quant = model::BaseQuant::none;
  bo.dense_dtype = ops::DType::f32;
  model::BaseWeights base = model::load_base_weights(ctx, ck, config, bo);

  const io::Adapter initial = io::load_adapter(dir / "ref" / "initial_adapter", model::lora_target_shapes(config));
  model::LoraSet lora(ctx, config, model::LoraSettings::from_peft(initial.config));
  lora.load(initial);

  const std::vector<model::TokenBatch> batches = read_batches(dir / "batch.json");
  const auto [max_b, max_s] = max_batch_shape(batches);
  {
    model::Transformer tf(ctx, base, lora, max_b, max_s, checkpointing, options);
    const std::vector<double> losses =
        train_like_reference(ctx, tf, lora, batches, read_json(dir / "ref" / "run.json"),
                             io::SafetensorsFile::open(dir / "ref" / "step0_grads.safetensors"));
    expect_losses_match(losses, dir / "ref" / "losses.json");
  }
  model::free_base_weights(ctx, base);
}

TEST_P(Parity, LossGradientsAndTwentyStepsMatchPyTorch) {
  const auto& [name, checkpointing] = GetParam();
  check_case(ctx(), name, checkpointing);
}

// The fused flash attention kernels' fp32 variant (ops/flash_attention.h, FlashKernel::f32) in
// place of the tiled ones, on packed sequences (segment masks), with checkpointing.
class ParityFlash : public GpuTest {};
TEST_F(ParityFlash, Qwen2PackedFlashAttentionF32) {
  model::TransformerOptions o;
  o.attention = model::TransformerOptions::Attention::flash;
  check_case(ctx(), "qwen2-packed", true, o);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<std::string, bool>>& info) {
  std::string n = std::get<0>(info.param) + (std::get<1>(info.param) ? "_ckpt" : "");
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Cases, Parity,
                         ::testing::Combine(::testing::Values("qwen3-tied", "qwen3-gqa-bf16", "qwen2-packed",
                                                              "llama3-rope-bias", "mistral-subset",
                                                              "qwen3-dropout"),
                                            ::testing::Values(false)),
                         case_name);
// Activation checkpointing recomputes each layer's forward inside the backward: same numbers.
INSTANTIATE_TEST_SUITE_P(Checkpointing, Parity,
                         ::testing::Values(std::make_tuple(std::string("qwen3-gqa-bf16"), true),
                                           std::make_tuple(std::string("qwen2-packed"), true),
                                           std::make_tuple(std::string("qwen3-dropout"), true)),
                         case_name);

}  // namespace
}  // namespace forja::test
