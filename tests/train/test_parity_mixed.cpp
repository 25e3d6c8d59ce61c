// Mixed precision (model/precision.h) against the same float64 PyTorch reference as the fp32
// parity tests: fp16 base weights (dense from the BF16 or F32 checkpoint, or NF4 decoded and
// rounded to fp16) and fp16-rounded activations in the base products and in LoRA's rank-r
// products (with fp16 copies of the LoRA factors; Qwen3LoraProductsFp32: fp32 there), fp32
// everywhere else. The losses of 20 AdamW steps and every step-0 LoRA gradient must be within
// 1e-2 relative; the measured differences are printed ([parity] lines).
//
// Attention runs through the GEMM kernels in chunks (ops/attention_gemm.h, automatic in mixed on
// devices with and without cooperative matrices; flash runs when asked for), except in
// Qwen3TiledAttention (the fp32 tiled kernels) and the Flash tests (ops/flash_attention.h).
// NF4 runs go through automatic's dequantise-to-fp16-then-dense-GEMM path, except Qwen3Nf4Fused
// and Qwen3Nf4_Emulated, which run the fused NF4 kernels (decode inside the product): the fp16
// scalar one, and the cooperative-matrix one's emulation (slow on lavapipe). On a device without
// cooperative matrices automatic runs the fp16 scalar kernels; on an NVIDIA GPU the real
// cooperative-matrix kernels (the dense one, gemm_nvcm_af32, is covered on lavapipe by its op
// test's emulation).
#include <gtest/gtest.h>

#include <filesystem>
#include <span>

#include "support/gpu_fixture.h"
#include "util/error.h"
#include "train/parity_support.h"

namespace forja::test {
namespace {

constexpr double kMixedTolerance = 1e-2;

ParityRun mixed(const std::string& name, model::BaseQuant quant, ops::GemmKernel kernel, bool checkpointing,
                model::TransformerOptions::Nf4Products nf4 = model::TransformerOptions::Nf4Products::automatic) {
  ParityRun r;
  r.name = name;
  r.quant = quant;
  r.options.precision = model::Precision::mixed;
  r.options.base_kernel = kernel;
  r.options.nf4_products = nf4;
  r.checkpointing = checkpointing;
  r.tol = kMixedTolerance;
  return r;
}

class ParityMixed : public GpuTest {};

TEST_F(ParityMixed, Qwen3TiedDense) {
  run_parity(ctx(), mixed("qwen3-tied", model::BaseQuant::none, ops::GemmKernel::automatic, false));
}

TEST_F(ParityMixed, Qwen3Bf16Dense) {
  run_parity(ctx(), mixed("qwen3-gqa-bf16", model::BaseQuant::none, ops::GemmKernel::automatic, false));
}

TEST_F(ParityMixed, Qwen3Nf4) {
  run_parity(ctx(), mixed("qwen3-gqa-bf16", model::BaseQuant::nf4, ops::GemmKernel::automatic, true));
}

// The fused NF4 products (decode inside the GEMM) instead of automatic's dequantise-then-GEMM.
TEST_F(ParityMixed, Qwen3Nf4Fused) {
  run_parity(ctx(), mixed("qwen3-gqa-bf16", model::BaseQuant::nf4, ops::GemmKernel::automatic, true,
                          model::TransformerOptions::Nf4Products::fused));
}

// Mixed products with the fp32 tiled attention kernels (TransformerOptions::Attention::tiled).
TEST_F(ParityMixed, Qwen3TiledAttention) {
  ParityRun r = mixed("qwen3-gqa-bf16", model::BaseQuant::none, ops::GemmKernel::automatic, false);
  r.options.attention = model::TransformerOptions::Attention::tiled;
  run_parity(ctx(), r);
}

// The fused flash attention kernels (TransformerOptions::Attention::flash): on cooperative
// matrices where the device has them, else their emulation (lavapipe); with NF4 and
// checkpointing (the backward recomputes the layer, attention included).
TEST_F(ParityMixed, Qwen3FlashAttention) {
  ParityRun r = mixed("qwen3-gqa-bf16", model::BaseQuant::none, ops::GemmKernel::automatic, false);
  r.options.attention = model::TransformerOptions::Attention::flash;
  run_parity(ctx(), r);
}

TEST_F(ParityMixed, Qwen2PackedFlashAttention) {
  ParityRun r = mixed("qwen2-packed", model::BaseQuant::none, ops::GemmKernel::automatic, false);
  r.options.attention = model::TransformerOptions::Attention::flash;
  run_parity(ctx(), r);
}

TEST_F(ParityMixed, Qwen3Nf4FlashAttentionCheckpointing) {
  ParityRun r = mixed("qwen3-gqa-bf16", model::BaseQuant::nf4, ops::GemmKernel::automatic, true);
  r.options.attention = model::TransformerOptions::Attention::flash;
  run_parity(ctx(), r);
}

// The base products' fp32 inputs rounded while staged inside the GEMM (the _af32 kernels) instead
// of into an fp16 copy first (TransformerOptions::fp16_input_copies).
TEST_F(ParityMixed, Qwen3InputsRoundedInsideTheGemm) {
  ParityRun r = mixed("qwen3-gqa-bf16", model::BaseQuant::nf4, ops::GemmKernel::automatic, false);
  r.options.fp16_input_copies = false;
  run_parity(ctx(), r);
}

// LoRA dropout in mixed: the dropout(x) A^T products and their backward on fp16 operands, with
// checkpointing (the backward regenerates the masks in the recomputed layer).
TEST_F(ParityMixed, Qwen3DropoutCheckpointing) {
  run_parity(ctx(), mixed("qwen3-dropout", model::BaseQuant::none, ops::GemmKernel::automatic, true));
}

// LoRA's rank-r products on the fp32 scalar kernels instead of automatic's fp16 operands
// (TransformerOptions::LoraProducts).
TEST_F(ParityMixed, Qwen3LoraProductsFp32) {
  ParityRun r = mixed("qwen3-gqa-bf16", model::BaseQuant::nf4, ops::GemmKernel::automatic, true);
  r.options.lora_products = model::TransformerOptions::LoraProducts::fp32;
  run_parity(ctx(), r);
}

TEST_F(ParityMixed, Qwen3Nf4_Emulated) {
  run_parity(ctx(), mixed("qwen3-gqa-bf16", model::BaseQuant::nf4, ops::GemmKernel::coopmat_emulated, false,
                          model::TransformerOptions::Nf4Products::fused));
}

// The reference precision refuses fp16 base weights, and mixed refuses fp32 ones: the
// precision of a run is never silently other than asked.
TEST_F(ParityMixed, TransformerRefusesBaseWeightsOfAnotherPrecision) {
  const auto dir = parity_cases_dir() / "qwen3-tied";
  const model::ModelConfig config = model::load_model_config(dir / "model");
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir / "model");
  model::BaseWeightOptions bo;
  bo.quant = model::BaseQuant::none;
  bo.dense_dtype = ops::DType::f16;
  model::BaseWeights base = model::load_base_weights(ctx(), ck, config, bo);
  model::LoraSet lora(ctx(), config, model::LoraSettings{});
  EXPECT_THROW(model::Transformer(ctx(), base, lora, 1, 4, false), std::logic_error);
  model::TransformerOptions mixed_options;
  mixed_options.precision = model::Precision::mixed;
  EXPECT_NO_THROW(model::Transformer(ctx(), base, lora, 1, 4, false, mixed_options));
  model::free_base_weights(ctx(), base);
}

// fp16 holds at most 65504: a checkpoint value beyond it (possible in BF16 or F32) is refused
// with a UserError naming the tensor rather than becoming an infinity.
TEST_F(ParityMixed, Fp16BaseWeightsRefuseValuesBeyondFp16Range) {
  namespace fs = std::filesystem;
  const fs::path src = parity_cases_dir() / "qwen3-tied" / "model";
  const fs::path out = fs::path(FORJA_BINARY_DIR) / "mixed_fp16_range_model";
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(src);
  const std::vector<std::string> names = ck.names();
  std::vector<std::vector<float>> storage;
  storage.reserve(names.size());
  std::vector<io::TensorToWrite> tensors;
  for (const std::string& name : names) {
    const io::TensorView t = ck.tensor(name);
    storage.push_back(t.to_float());
    if (name == "model.layers.0.mlp.up_proj.weight") storage.back()[5] = 70000.0f;
    tensors.push_back({name, io::Dtype::F32, t.shape(), std::as_bytes(std::span(storage.back())), {}});
  }
  fs::create_directories(out);
  fs::copy_file(src / "config.json", out / "config.json", fs::copy_options::overwrite_existing);
  io::write_safetensors(out / "model.safetensors", std::move(tensors));

  const model::ModelConfig config = model::load_model_config(out);
  const io::SafetensorsCheckpoint big = io::SafetensorsCheckpoint::open(out);
  model::BaseWeightOptions bo;
  bo.quant = model::BaseQuant::none;
  bo.dense_dtype = ops::DType::f16;
  try {
    model::BaseWeights base = model::load_base_weights(ctx(), big, config, bo);
    model::free_base_weights(ctx(), base);
    ADD_FAILURE() << "no UserError for 70000 in fp16";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
  bo.dense_dtype = ops::DType::f32;
  model::BaseWeights base = model::load_base_weights(ctx(), big, config, bo);
  model::free_base_weights(ctx(), base);
}

}  // namespace
}  // namespace forja::test
