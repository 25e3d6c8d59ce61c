// Mixed precision (model/precision.h) against the same float64 PyTorch reference as the fp32
// parity tests: fp16 base weights (dense from the BF16 or F32 checkpoint, or NF4 decoded and
// rounded to fp16) and fp16-rounded activations in the base products and in LoRA's rank-r
// products (with fp16 copies of the LoRA factors; Qwen3LoraProductsFp32: fp32 there), fp32
// everywhere else. The losses of 20 AdamW steps and every step-0 LoRA gradient must be within
// 1e-2 relative; the measured differences are printed ([parity] lines).
//
// Attention runs through the GEMM kernels in chunks (ops/attention_gemm.h, automatic in mixed on
// devices with and without cooperative matrices; flash runs when asked for), except in
// Qwen3TiledAttention (the fp32 tiled kernels), the Flash tests (ops/flash_attention.h) and
// FusedAttentionEmulated (the GEMM path's fused forward and backward kernels, emulated).
// NF4 runs go through automatic's dequantise-to-fp16-then-dense-GEMM path, except Qwen3Nf4Fused
// and Qwen3Nf4_Emulated, which run the fused NF4 kernels (decode inside the product): the fp16
// scalar one, and the cooperative-matrix one's emulation (slow on lavapipe). On a device without
// cooperative matrices automatic runs the fp16 scalar kernels; on an NVIDIA GPU the real
// cooperative-matrix kernels (the dense one, gemm_nvcm_af32, is covered on lavapipe by its op
// test's emulation).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <span>

#include "model/random_model.h"
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

// The fused attention kernels (ops/attention_gemm.h: forward and backward) in their emulation,
// which lavapipe runs: the engine's use of them (lse and D, GQA, packing with padding,
// accumulation over micro-batches) against PyTorch. On a GPU the other ParityMixed cases run the
// real ones (the default there; bench/device_check.sh).
TEST_F(ParityMixed, FusedAttentionEmulated) {
  for (const char* name : {"qwen3-tied", "qwen2-packed"}) {
    ParityRun r = mixed(name, model::BaseQuant::none, ops::GemmKernel::automatic, false);
    r.options.attention = model::TransformerOptions::Attention::gemm;
    r.options.fused_attention_emulated = true;
    run_parity(ctx(), r);
  }
}

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

// A parity case's model (qwen3-tied unless named) written as F32 to `out`, with `change` applied to
// each tensor.
void write_changed_model(const std::filesystem::path& out,
                         const std::function<void(const std::string&, std::vector<float>&)>& change,
                         const std::string& parity_case = "qwen3-tied") {
  namespace fs = std::filesystem;
  const fs::path src = parity_cases_dir() / parity_case / "model";
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(src);
  const std::vector<std::string> names = ck.names();
  std::vector<std::vector<float>> storage;
  storage.reserve(names.size());
  std::vector<io::TensorToWrite> tensors;
  for (const std::string& name : names) {
    const io::TensorView t = ck.tensor(name);
    storage.push_back(t.to_float());
    change(name, storage.back());
    tensors.push_back({name, io::Dtype::F32, t.shape(), std::as_bytes(std::span(storage.back())), {}});
  }
  fs::create_directories(out);
  fs::copy_file(src / "config.json", out / "config.json", fs::copy_options::overwrite_existing);
  io::write_safetensors(out / "model.safetensors", std::move(tensors));
}

// fp16 holds at most 65504: a checkpoint value beyond it (possible in BF16 or F32) is refused
// with a UserError naming the tensor rather than becoming an infinity.
TEST_F(ParityMixed, Fp16BaseWeightsRefuseValuesBeyondFp16Range) {
  namespace fs = std::filesystem;
  const fs::path out = fs::path(FORJA_BINARY_DIR) / "mixed_fp16_range_model";
  write_changed_model(out, [](const std::string& name, std::vector<float>& v) {
    if (name == "model.layers.0.mlp.up_proj.weight") v[5] = 70000.0f;
  });

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

// One mixed-precision training step of the model in `dir` with `quant` base weights: the forward
// range check's report (Transformer::fp16_range_report), after checking that a reset clears it.
std::string range_report(gpu::Context& ctx, const std::filesystem::path& dir, const model::ModelConfig& config,
                         model::BaseQuant quant, const model::TokenBatch& batch) {
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir);
  model::BaseWeightOptions bo;
  bo.quant = quant;
  bo.dense_dtype = ops::DType::f16;
  model::BaseWeights base = model::load_base_weights(ctx, ck, config, bo);
  std::string report;
  {
    model::LoraSet lora(ctx, config, model::LoraSettings{});
    lora.init_peft(1);
    model::TransformerOptions options;
    options.precision = model::Precision::mixed;
    model::Transformer tf(ctx, base, lora, batch.batch, batch.seq, false, options);
    gpu::Buffer loss = ctx.alloc(16, "loss");
    ctx.fill(loss, 0);
    tf.reset_fp16_range_check();
    tf.run(batch, 1.0f, loss, true);
    report = tf.fp16_range_report();
    ctx.free(loss);
    tf.reset_fp16_range_check();
    EXPECT_EQ(tf.fp16_range_report(), "");  // reset clears what the run raised
  }
  model::free_base_weights(ctx, base);
  return report;
}

// The forward range check (Transformer::fp16_range_report): an fp32 norm weight of 1e5 in the
// last layer's post-attention norm puts its MLP input beyond fp16's range; the report names that
// layer and input, with dense fp16 weights (to_f16) and with NF4 ones, whose products fold LoRA
// in: to_f16_block makes their fp16 input in qwen3-tied (hidden 48), the norm itself in the GQA
// case (hidden 64: rmsnorm_forward_f16, Transformer::norm_f16). The unchanged models report nothing.
TEST_F(ParityMixed, ForwardRangeCheckNamesTheLayerAndInput) {
  namespace fs = std::filesystem;
  for (const std::string parity_case : {"qwen3-tied", "qwen3-gqa-bf16"}) {
    const fs::path plain = parity_cases_dir() / parity_case / "model";
    const fs::path big = fs::path(FORJA_BINARY_DIR) / ("mixed_fp16_range_norm_model_" + parity_case);
    const model::ModelConfig config = model::load_model_config(plain);
    const int64_t last = config.num_layers - 1;
    const std::string norm = "model.layers." + std::to_string(last) + ".post_attention_layernorm.weight";
    write_changed_model(
        big,
        [&](const std::string& name, std::vector<float>& v) {
          if (name == norm)
            for (float& x : v) x *= 1e5f;
        },
        parity_case);
    const model::TokenBatch batch = model::random_token_batch(2, 9, config.vocab_size, 4);
    for (model::BaseQuant quant : {model::BaseQuant::none, model::BaseQuant::nf4})
      for (const fs::path& dir : {plain, big}) {
        SCOPED_TRACE((quant == model::BaseQuant::nf4 ? "nf4 " : "dense ") + dir.string());
        const std::string report = range_report(ctx(), dir, config, quant, batch);
        if (dir == plain) {
          EXPECT_EQ(report, "");
        } else {
          EXPECT_NE(report.find("layer " + std::to_string(last) + "'s MLP input"), std::string::npos) << report;
          EXPECT_NE(report.find("65504"), std::string::npos) << report;
        }
      }
  }
}

// The same for down_proj's input, which NF4 models' SwiGLU writes as fp16 directly
// (swiglu_forward_f16, Transformer::down_f16): the last layer's gate and up weights times 1e5
// (within fp16's range) make silu(gate) * up about 1e8.
TEST_F(ParityMixed, ForwardRangeCheckNamesTheMlpActivation) {
  namespace fs = std::filesystem;
  const fs::path plain = parity_cases_dir() / "qwen3-tied" / "model";
  const fs::path big = fs::path(FORJA_BINARY_DIR) / "mixed_fp16_range_mlp_model";
  const model::ModelConfig config = model::load_model_config(plain);
  const std::string prefix = "model.layers." + std::to_string(config.num_layers - 1) + ".mlp.";
  write_changed_model(big, [&](const std::string& name, std::vector<float>& v) {
    if (name == prefix + "gate_proj.weight" || name == prefix + "up_proj.weight")
      for (float& x : v) x *= 1e5f;
  });
  const model::TokenBatch batch = model::random_token_batch(2, 9, config.vocab_size, 4);
  const std::string report = range_report(ctx(), big, config, model::BaseQuant::nf4, batch);
  EXPECT_NE(report.find("layer " + std::to_string(config.num_layers - 1) + "'s MLP activation"), std::string::npos)
      << report;
}

}  // namespace
}  // namespace forja::test
