// train::step (train/step.h) on a small NF4 QLoRA engine:
// - the engine learns: on a toy memorisation task (one fixed batch of random tokens) the loss
//   falls by more than half within 100 steps, and after the first update (when B is no longer
//   zero) every adapter's A and B receive a non-zero gradient;
// - a step waits for the GPU once (issue 14: no host sync inside a step but the loss and norm
//   read at its end), whatever its number of micro-batches, and accumulating micro-batches gives
//   the loss of the same tokens in one;
// - a mixed-precision engine, which keeps dequantised weights between products and runs, runs
//   with the LoRA factors of each run.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "io/safetensors.h"
#include "model/base_weights.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "ops/attention_gemm.h"
#include "support/gpu_fixture.h"
#include "train/example.h"
#include "train/optimizer.h"
#include "train/step.h"

namespace forja::test {
namespace {
namespace fs = std::filesystem;

// A small example model (NF4, double quant) with rank-16 adapters on every projection.
class StepEngineTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    dir_ = fs::temp_directory_path() / ("forja_step_" + std::to_string(::getpid()));
    train::ExampleModelShape shape;
    shape.hidden = 64;
    shape.intermediate = 128;
    shape.head_dim = 16;
    train::write_example_model(dir_, 11, shape);
    config_ = model::load_model_config(dir_);
    const auto ck = io::SafetensorsCheckpoint::open(dir_);
    base_ = std::make_unique<model::BaseWeights>(model::load_base_weights(ctx(), ck, config_, {}));
    model::LoraSettings ls;
    ls.rank = 16;
    ls.alpha = 32;
    lora_ = std::make_unique<model::LoraSet>(ctx(), config_, ls);
    lora_->init_peft(5);
    loss_sum_ = ctx().alloc(16);
  }
  void TearDown() override {
    ctx().free(loss_sum_);
    lora_.reset();
    model::free_base_weights(ctx(), *base_);
    fs::remove_all(dir_);
    GpuTest::TearDown();
  }

  // `batch` sequences of `seq` random tokens, each predicting the next.
  model::TokenBatch random_batch(uint32_t batch, uint32_t seq, uint32_t seed) const {
    model::TokenBatch b;
    b.batch = batch;
    b.seq = seq;
    std::mt19937 rng(seed);
    for (uint32_t i = 0; i < batch * seq; ++i) {
      b.input_ids.push_back(int32_t(rng() % uint32_t(config_.vocab_size)));
      b.positions.push_back(int32_t(i % seq));
      b.segments.push_back(1);
    }
    for (uint32_t i = 0; i < batch * seq; ++i) b.targets.push_back(i % seq + 1 < seq ? b.input_ids[i + 1] : -100);
    return b;
  }

  fs::path dir_;
  model::ModelConfig config_;
  std::unique_ptr<model::BaseWeights> base_;
  std::unique_ptr<model::LoraSet> lora_;
  gpu::Buffer loss_sum_;
};

using Memorisation = StepEngineTest;

TEST_F(Memorisation, LossHalvesWithin100StepsAndEveryAdapterGetsGradient) {
  const model::TokenBatch b = random_batch(1, 16, 3);
  model::LoraSet& lora = *lora_;
  model::Transformer tf(ctx(), *base_, lora, b.batch, b.seq, false);
  train::OptimizerSettings os;
  os.lr = 2e-2;
  os.max_grad_norm = 1.0;
  os.total_steps = 100;
  train::AdamW adamw(ctx(), lora, os);
  const train::StepEngine engine{ctx(), tf, lora, adamw, loss_sum_};
  train::StepInput in;
  in.micro_batches = {{&b, 0}};
  in.targets = b.target_count();
  std::vector<double> losses;
  for (int64_t step = 0; step < 100; ++step) {
    train::StepHooks hooks;
    if (step == 1)
      hooks.gradients_ready = [&] {
        const auto g = ctx().download<float>(lora.grads(), lora.parameter_count());
        for (const model::LoraSlot& s : lora.slots()) {
          auto nonzero = [&](uint64_t off, uint64_t n) {
            for (uint64_t i = 0; i < n; ++i)
              if (g[off + i] != 0.0f) return true;
            return false;
          };
          EXPECT_TRUE(nonzero(s.a_offset, uint64_t(s.rank) * s.in))
              << "layer " << s.layer << " " << model::linear_name(s.kind) << " A";
          EXPECT_TRUE(nonzero(s.b_offset, uint64_t(s.out) * s.rank))
              << "layer " << s.layer << " " << model::linear_name(s.kind) << " B";
        }
      };
    in.step = step;
    losses.push_back(train::step(engine, in, hooks).loss);
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
}

using TrainStep = StepEngineTest;

TEST_F(TrainStep, WaitsForTheGpuOnceWhateverItsMicroBatches) {
  // Three micro-batches of two sequences, and the same six sequences as one micro-batch.
  std::vector<model::TokenBatch> parts = {random_batch(2, 24, 1), random_batch(2, 24, 2), random_batch(2, 24, 3)};
  model::TokenBatch whole;
  whole.batch = 6;
  whole.seq = 24;
  for (const model::TokenBatch& p : parts) {
    whole.input_ids.insert(whole.input_ids.end(), p.input_ids.begin(), p.input_ids.end());
    whole.targets.insert(whole.targets.end(), p.targets.begin(), p.targets.end());
    whole.positions.insert(whole.positions.end(), p.positions.begin(), p.positions.end());
    whole.segments.insert(whole.segments.end(), p.segments.begin(), p.segments.end());
  }
  model::Transformer tf(ctx(), *base_, *lora_, whole.batch, whole.seq, true);
  train::OptimizerSettings os;
  os.lr = 0;  // the parameters stay as they are, so every step sees the same model
  os.total_steps = 10;
  train::AdamW adamw(ctx(), *lora_, os);
  const train::StepEngine engine{ctx(), tf, *lora_, adamw, loss_sum_};
  train::StepInput split, one;
  for (size_t i = 0; i < parts.size(); ++i) split.micro_batches.push_back({&parts[i], i});
  one.micro_batches = {{&whole, 0}};
  split.targets = one.targets = whole.target_count();

  train::step(engine, one);  // the first step creates the pipelines (no waits either, but warm)
  ctx().finish();
  for (const train::StepInput* in : {&split, &one, &split}) {
    const uint64_t before = ctx().drains();
    const train::StepResult r = train::step(engine, *in);
    EXPECT_EQ(ctx().drains() - before, 1u) << in->micro_batches.size() << " micro-batches";
    EXPECT_TRUE(r.applied);
  }
  ctx().finish();
  const double a = train::step(engine, split).loss, b = train::step(engine, one).loss;
  EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << "accumulated micro-batches against one batch";
}

// Mixed precision keeps each projection kind's dequantised NF4 weight in a slot and reuses it
// while the slot holds that layer's W (Transformer::DequantSlot), with the LoRA blocks beside and
// below it, which change with every optimizer step. A run after the factors change gives the loss
// and gradients a fresh engine gives, with checkpointing (whose backward takes W from the
// recomputation) and without.
TEST_F(TrainStep, MixedEngineRunsWithEachRunsFactors) {
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir_);
  model::BaseWeightOptions bo;
  bo.dense_dtype = ops::DType::f16;
  model::BaseWeights base = model::load_base_weights(ctx(), ck, config_, bo);
  const model::TokenBatch b = random_batch(2, 12, 7);
  model::TransformerOptions options;
  options.precision = model::Precision::mixed;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  auto randomise = [&] {
    std::vector<float> p(lora_->parameter_count());
    for (float& x : p) x = normal(rng);
    ctx().upload(lora_->params(), p);
  };
  auto run = [&](model::Transformer& tf) {
    lora_->zero_grads();
    ctx().fill(loss_sum_, 0);
    tf.run(b, 1.0f / float(b.target_count()), loss_sum_, true);
    return std::pair{ctx().download<float>(loss_sum_, 1)[0], ctx().download<float>(lora_->grads(), lora_->parameter_count())};
  };
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "checkpointing" : "no checkpointing");
    randomise();
    model::Transformer tf(ctx(), base, *lora_, b.batch, b.seq, checkpointing, options);
    const auto first = run(tf);
    randomise();
    const auto second = run(tf);
    model::Transformer fresh(ctx(), base, *lora_, b.batch, b.seq, checkpointing, options);
    const auto want = run(fresh);
    EXPECT_NE(first.first, want.first);  // the new factors change the loss
    EXPECT_EQ(second.first, want.first);
    EXPECT_EQ(second.second, want.second);
  }
  model::free_base_weights(ctx(), base);
}

// With checkpointing, the engine keeps each layer's attention output (fp16, as o_proj reads it)
// and log-sum-exp from the forward, and the recomputation skips attention's forward
// (TransformerOptions::keep_attention). The loss is the same bit for bit (the forward is); the
// gradients differ from a full recomputation only by D = rowsum(dout * out) taking out in fp16.
// Packed sequences and two of them, through the fused kernels (their emulation where the device
// lacks them: lavapipe).
TEST_F(TrainStep, KeptAttentionOutputsMatchTheRecomputation) {
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir_);
  model::BaseWeightOptions bo;
  bo.dense_dtype = ops::DType::f16;
  model::BaseWeights base = model::load_base_weights(ctx(), ck, config_, bo);
  model::TokenBatch b = random_batch(2, 24, 9);
  for (uint32_t i = 0; i < b.seq; ++i) b.segments[i] = i < 10 ? 1 : 2;  // two documents in the first
  for (uint32_t i = 10; i < b.seq; ++i) b.positions[i] = int32_t(i - 10);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> p(lora_->parameter_count());
  for (float& x : p) x = normal(rng);
  ctx().upload(lora_->params(), p);
  auto run = [&](bool keep, bool& kept) {
    model::TransformerOptions options;
    options.precision = model::Precision::mixed;
    options.attention = model::TransformerOptions::Attention::gemm;
    options.fused_attention_emulated = !ops::attention_fused_forward_supported(ctx(), uint32_t(config_.head_dim));
    options.keep_attention = keep;
    model::Transformer tf(ctx(), base, *lora_, b.batch, b.seq, true, options);
    kept = tf.keeps_attention();
    lora_->zero_grads();
    ctx().fill(loss_sum_, 0);
    tf.run(b, 1.0f / float(b.target_count()), loss_sum_, true);
    return std::pair{ctx().download<float>(loss_sum_, 1)[0], ctx().download<float>(lora_->grads(), lora_->parameter_count())};
  };
  bool kept = false, recomputed = true;
  const auto with = run(true, kept), without = run(false, recomputed);
  EXPECT_TRUE(kept);
  EXPECT_FALSE(recomputed);
  EXPECT_EQ(with.first, without.first);
  double largest = 0, worst = 0;
  for (size_t i = 0; i < with.second.size(); ++i) {
    largest = std::max(largest, double(std::abs(without.second[i])));
    worst = std::max(worst, double(std::abs(with.second[i] - without.second[i])));
  }
  std::printf("[kept attention] largest gradient %.3e, largest difference %.3e\n", largest, worst);
  EXPECT_GT(largest, 0.0);
  EXPECT_LE(worst, 2e-3 * largest) << "largest gradient " << largest;
  model::free_base_weights(ctx(), base);
}

// With checkpointing, the engine keeps each layer's LoRA inputs t from the forward, and the
// recomputation runs no x A^T product (TransformerOptions::keep_lora_inputs). The products are
// deterministic, so the kept t is the recomputed one and the loss and gradients are the same bit
// for bit: in fp32 (t beside the base products) and mixed (t folded into the NF4 products, fp16
// copies), with and without LoRA dropout (whose masks the recomputation would regenerate).
TEST_F(TrainStep, KeptLoraInputsMatchTheRecomputation) {
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir_);
  const model::TokenBatch b = random_batch(2, 20, 13);
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> p(lora_->parameter_count());
  for (float& x : p) x = normal(rng);
  for (model::Precision precision : {model::Precision::fp32, model::Precision::mixed}) {
    model::BaseWeightOptions bo;
    bo.dense_dtype = model::dense_dtype_for(precision);
    model::BaseWeights base = model::load_base_weights(ctx(), ck, config_, bo);
    for (double dropout : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(precision == model::Precision::fp32 ? "fp32" : "mixed") + ", dropout " +
                   std::to_string(dropout));
      model::LoraSettings ls = lora_->settings();
      ls.dropout = dropout;
      model::LoraSet lora(ctx(), config_, ls);
      ctx().upload(lora.params(), p);
      auto run = [&](bool keep, bool& kept) {
        model::TransformerOptions options;
        options.precision = precision;
        options.keep_lora_inputs = keep;
        model::Transformer tf(ctx(), base, lora, b.batch, b.seq, true, options);
        kept = tf.keeps_lora_inputs();
        if (dropout > 0) tf.set_dropout_seed(3, 1, 0);
        lora.zero_grads();
        ctx().fill(loss_sum_, 0);
        tf.run(b, 1.0f / float(b.target_count()), loss_sum_, true);
        return std::pair{ctx().download<float>(loss_sum_, 1)[0], ctx().download<float>(lora.grads(), lora.parameter_count())};
      };
      bool kept = false, recomputed = true;
      const auto with = run(true, kept), without = run(false, recomputed);
      EXPECT_TRUE(kept);
      EXPECT_FALSE(recomputed);
      EXPECT_EQ(with.first, without.first);
      EXPECT_EQ(with.second, without.second);
      double largest = 0;
      for (float g : with.second) largest = std::max(largest, double(std::abs(g)));
      EXPECT_GT(largest, 0.0);
    }
    model::free_base_weights(ctx(), base);
  }
}

// In mixed precision the NF4 products fold their LoRA factors ([x | t] [W | s B]^T forward,
// [dy | dt] [W ; A] backward), the projections of one input with their factors side by side in
// the fold's columns where their ranks fit (Transformer::fold_side_by_side). Against the same
// engine without the fold (no fp16 input copies: the LoRA updates as separate products) the loss
// and gradients agree to fp16 rounding at ranks where every group fits (4), where q/k/v does not
// and gate/up does (24), and where neither does (48); a factor in the wrong columns is far off.
// The example model's default shape (kv heads x head_dim = 64, the fold's pad) also takes the
// q/k norms' backward straight into q's and k's fp16 copies (Transformer::qk_backward_f16).
TEST_F(TrainStep, FoldedLoraMatchesTheUnfoldedAtEveryRank) {
  auto compare = [&](const fs::path& dir, const model::ModelConfig& config, int64_t rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ", kv heads x head_dim " +
                 std::to_string(config.num_kv_heads * config.head_dim));
    const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir);
    const model::TokenBatch b = random_batch(2, 20, 17);
    model::BaseWeightOptions bo;
    bo.dense_dtype = model::dense_dtype_for(model::Precision::mixed);
    model::BaseWeights base = model::load_base_weights(ctx(), ck, config, bo);
    model::LoraSettings ls = lora_->settings();
    ls.rank = rank;
    ls.alpha = 2.0 * double(rank);
    model::LoraSet lora(ctx(), config, ls);
    std::mt19937 rng(9);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> p(lora.parameter_count());
    for (float& x : p) x = normal(rng);
    ctx().upload(lora.params(), p);
    auto run = [&](bool fold) {
      model::TransformerOptions options;
      options.precision = model::Precision::mixed;
      options.fp16_input_copies = fold;  // the fold reads the inputs' fp16 copies
      model::Transformer tf(ctx(), base, lora, b.batch, b.seq, true, options);
      lora.zero_grads();
      ctx().fill(loss_sum_, 0);
      tf.run(b, 1.0f / float(b.target_count()), loss_sum_, true);
      return std::pair{ctx().download<float>(loss_sum_, 1)[0], ctx().download<float>(lora.grads(), lora.parameter_count())};
    };
    const auto folded = run(true), separate = run(false);
    EXPECT_NEAR(folded.first, separate.first, 1e-3 * std::abs(separate.first));
    double largest = 0, worst = 0;
    for (size_t i = 0; i < separate.second.size(); ++i) {
      largest = std::max(largest, double(std::abs(separate.second[i])));
      worst = std::max(worst, double(std::abs(folded.second[i] - separate.second[i])));
    }
    EXPECT_GT(largest, 0.0);
    EXPECT_LE(worst, 1e-2 * largest) << "largest gradient " << largest;
    model::free_base_weights(ctx(), base);
  };
  for (int64_t rank : {4, 24, 48}) compare(dir_, config_, rank);
  const fs::path wide = dir_.string() + "_wide";
  train::write_example_model(wide, 12);  // the default shape: 2 kv heads x 32
  const model::ModelConfig wide_config = model::load_model_config(wide);
  ASSERT_GE(wide_config.num_kv_heads * wide_config.head_dim, 64);
  compare(wide, wide_config, 16);
  fs::remove_all(wide);
}

}  // namespace
}  // namespace forja::test
