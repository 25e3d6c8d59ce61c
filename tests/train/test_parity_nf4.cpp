// QLoRA's base path against the PyTorch reference: forja trains on NF4-quantised base weights
// (fused NF4 GEMMs, double quantisation on); the reference trains on the same weights
// dequantised on the CPU (model::nf4_dequantize, bitsandbytes-exact) and written to a new
// checkpoint. Gradients of step 0 and the losses of 20 AdamW steps must match to 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/adapter.h"
#include "io/safetensors.h"
#include "model/base_weights.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/nf4.h"
#include "model/transformer.h"
#include "support/gpu_fixture.h"
#include "train/parity_support.h"

namespace forja::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Writes `out`/model with every projection weight replaced by dequant(quant(W)) in F32.
void write_dequantized_model(const fs::path& src, const fs::path& out) {
  const model::ModelConfig config = model::load_model_config(src);
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(src);
  std::set<std::string> linears;
  for (int64_t i = 0; i < config.num_layers; ++i)
    for (model::LinearKind k : model::kAllLinears) linears.insert(model::linear_path(i, k) + ".weight");
  const std::vector<std::string> names = ck.names();
  std::vector<std::vector<float>> storage;  // reserved: the spans below point into it
  storage.reserve(names.size());
  std::vector<io::TensorToWrite> tensors;
  for (const std::string& name : names) {
    const io::TensorView t = ck.tensor(name);
    if (linears.count(name)) {
      model::Nf4Tensor q = model::nf4_quantize(t, model::Nf4Options{true, 1});
      storage.push_back(model::nf4_dequantize(q));
    } else {
      storage.push_back(t.to_float());
    }
    tensors.push_back({name, io::Dtype::F32, t.shape(), std::as_bytes(std::span(storage.back())), {}});
  }
  fs::create_directories(out);
  fs::copy_file(src / "config.json", out / "config.json", fs::copy_options::overwrite_existing);
  io::write_safetensors(out / "model.safetensors", std::move(tensors));
}

class ParityNf4 : public GpuTest {};

TEST_F(ParityNf4, Qwen3TrainsOnNf4LikeTheReferenceOnDequantisedWeights) {
  const std::string name = "qwen3-gqa-bf16";
  const fs::path src_case = parity_cases_dir() / name;
  const json run = read_json(src_case / "ref" / "run.json");
  const fs::path dir = fs::path(FORJA_BINARY_DIR) / ("parity_nf4_" + name);
  if (!fs::exists(dir / "model" / "model.safetensors")) write_dequantized_model(src_case / "model", dir / "model");
  run_once("/usr/bin/python3 " + std::string(FORJA_SOURCE_DIR) + "/tests/reference/reference_run.py" +
               " --model " + (dir / "model").string() + " --batch " + (src_case / "batch.json").string() +
               " --adapter " + (src_case / "ref" / "initial_adapter").string() + " --out " + (dir / "ref").string() +
               " --steps " + std::to_string(run.at("steps").get<int>()) + " --lr " +
               std::to_string(run.at("lr").get<double>()) + " --schedule " + run.at("schedule").get<std::string>() +
               " --warmup " + std::to_string(run.at("warmup").get<int>()) + " --grad-accum " +
               std::to_string(run.at("grad_accum").get<int>()) + " --weight-decay " +
               std::to_string(run.at("weight_decay").get<double>()) + " --max-grad-norm " +
               std::to_string(run.at("max_grad_norm").get<double>()) + " > " + dir.string() + ".log 2>&1",
           dir / "ref.done");

  const model::ModelConfig config = model::load_model_config(src_case / "model");
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(src_case / "model");
  model::BaseWeightOptions bo;
  bo.quant = model::BaseQuant::nf4;
  bo.double_quant = true;
  model::BaseWeights base = model::load_base_weights(ctx(), ck, config, bo);
  const io::Adapter initial = io::load_adapter(src_case / "ref" / "initial_adapter", model::lora_target_shapes(config));
  model::LoraSet lora(ctx(), config, model::LoraSettings::from_peft(initial.config));
  lora.load(initial);

  const std::vector<model::TokenBatch> batches = read_batches(src_case / "batch.json");
  const auto [max_b, max_s] = max_batch_shape(batches);
  {
    model::Transformer tf(ctx(), base, lora, max_b, max_s, /*grad_checkpointing=*/true);
    const std::vector<double> losses = train_like_reference(
        ctx(), tf, lora, batches, run, io::SafetensorsFile::open(dir / "ref" / "step0_grads.safetensors"));
    expect_losses_match(losses, dir / "ref" / "losses.json");
  }
  model::free_base_weights(ctx(), base);
}

}  // namespace
}  // namespace forja::test
