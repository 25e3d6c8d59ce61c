// LoRA dropout inside the training engine (model::Transformer): with a fixed dropout seed the
// loss is a deterministic function of the LoRA parameters, so its gradient is checked by
// central finite differences along several directions (all parameters, A only, B only), with
// and without activation checkpointing. Also: masks change with the seed, step and micro-batch;
// forward-only runs see no dropout; the seed must be set before every backward run; the
// scratch is the only memory added. (Exact masks against PyTorch: the qwen3-dropout parity case.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>

#include "io/adapter.h"
#include "io/safetensors.h"
#include "model/base_weights.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "support/gpu_fixture.h"
#include "train/parity_support.h"
#include "util/error.h"

namespace forja::test {
namespace {

namespace fs = std::filesystem;

class DropoutEngine : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    dir_ = parity_case_dir("qwen3-dropout");
    config_ = model::load_model_config(dir_ / "model");
    const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir_ / "model");
    model::BaseWeightOptions bo;
    bo.quant = model::BaseQuant::none;
    bo.dense_dtype = ops::DType::f32;
    base_ = std::make_unique<model::BaseWeights>(model::load_base_weights(ctx(), ck, config_, bo));
    initial_ = io::load_adapter(dir_ / "ref" / "initial_adapter", model::lora_target_shapes(config_));
    batches_ = read_batches(dir_ / "batch.json");
    loss_sum_ = ctx().alloc(16);
  }
  void TearDown() override {
    ctx().free(loss_sum_);
    model::free_base_weights(ctx(), *base_);
    GpuTest::TearDown();
  }
  std::unique_ptr<model::LoraSet> make_lora(double p) {
    model::LoraSettings s = model::LoraSettings::from_peft(initial_.config);
    s.dropout = p;
    auto lora = std::make_unique<model::LoraSet>(ctx(), config_, s);
    lora->load(initial_);
    return lora;
  }
  // Mean loss of micro-batch 0 (fp32 sum on the GPU, divided here); gradients of mean loss land
  // in lora.grads() (zeroed first) when backward.
  double loss(model::Transformer& tf, model::LoraSet& lora, bool backward, uint64_t seed = 5, uint64_t step = 0,
              uint64_t micro = 0) {
    const model::TokenBatch& b = batches_[0];
    const double n = double(b.target_count());
    lora.zero_grads();
    ctx().fill(loss_sum_, 0);
    tf.set_dropout_seed(seed, step, micro);
    tf.run(b, static_cast<float>(1.0 / n), loss_sum_, backward);
    return ctx().download<float>(loss_sum_, 1)[0] / n;
  }
  // Directional derivatives of the loss along unit vectors v (central differences) against
  // grad . v, over all parameters, A only and B only.
  void check_directions(model::Transformer& tf, model::LoraSet& lora);
  std::pair<uint32_t, uint32_t> shape() const { return {batches_[0].batch, batches_[0].seq}; }

  fs::path dir_;
  model::ModelConfig config_;
  std::unique_ptr<model::BaseWeights> base_;
  io::Adapter initial_;
  std::vector<model::TokenBatch> batches_;
  gpu::Buffer loss_sum_;
};

// Directional derivative of the loss along unit vectors v, by central differences, against
// grad . v. `which`: 0 all parameters, 1 A only, 2 B only.
void DropoutEngine::check_directions(model::Transformer& tf, model::LoraSet& lora) {
  gpu::Context& ctx = this->ctx();
  const uint64_t n = lora.parameter_count();
  const std::vector<float> theta = ctx.download<float>(lora.params(), n);
  loss(tf, lora, true, 5, 0, 0);
  const std::vector<float> grad = ctx.download<float>(lora.grads(), n);
  std::vector<char> is_a(n, 0);
  for (const model::LoraSlot& s : lora.slots())
    for (uint64_t i = 0; i < uint64_t(s.rank) * s.in; ++i) is_a[s.a_offset + i] = 1;
  std::mt19937_64 rng(77);
  std::normal_distribution<double> normal;
  for (int which : {0, 1, 2}) {
    for (int trial = 0; trial < 2; ++trial) {
      SCOPED_TRACE("params " + std::string(which == 0 ? "all" : which == 1 ? "A" : "B") + " trial " +
                   std::to_string(trial));
      // v = the gradient (restricted) plus noise of the same norm, normalised: a direction with a
      // large derivative that a wrong gradient would not reproduce.
      std::vector<double> v(n, 0.0);
      double gnorm = 0;
      for (uint64_t i = 0; i < n; ++i)
        if (which == 0 || (which == 1) == bool(is_a[i])) gnorm += double(grad[i]) * grad[i];
      gnorm = std::sqrt(gnorm);
      ASSERT_GT(gnorm, 0.0);
      const double noise = gnorm / std::sqrt(double(n));
      double vnorm = 0;
      for (uint64_t i = 0; i < n; ++i)
        if (which == 0 || (which == 1) == bool(is_a[i])) {
          v[i] = grad[i] + noise * normal(rng);
          vnorm += v[i] * v[i];
        }
      vnorm = std::sqrt(vnorm);
      double gv = 0;
      for (uint64_t i = 0; i < n; ++i) {
        v[i] /= vnorm;
        gv += double(grad[i]) * v[i];
      }
      const double h = 3e-3 / std::abs(gv);  // a loss change of about 3e-3
      auto at = [&](double s) {
        std::vector<float> p(theta);
        for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<float>(theta[i] + s * v[i]);
        ctx.upload(lora.params(), p);
        return loss(tf, lora, true, 5, 0, 0);
      };
      const double fd = (at(h) - at(-h)) / (2 * h);
      ctx.upload(lora.params(), theta);
      EXPECT_NEAR(fd, gv, 2e-3 * std::abs(gv)) << "h " << h;
      if (std::getenv("FORJA_REF_VERBOSE")) std::printf("fd %.9g  grad.v %.9g  rel %.2e\n", fd, gv, std::abs(fd - gv) / std::abs(gv));
    }
  }
}

TEST_F(DropoutEngine, GradientMatchesFiniteDifferences) {
  auto lora = make_lora(0.3);
  const auto [b, s] = shape();
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "checkpointing" : "no checkpointing");
    model::Transformer tf(ctx(), *base_, *lora, b, s, checkpointing);
    check_directions(tf, *lora);
  }
}

TEST_F(DropoutEngine, MasksFollowSeedStepAndMicroBatchAndOnlyInBackwardRuns) {
  auto lora = make_lora(0.3);
  const auto [b, s] = shape();
  model::Transformer tf(ctx(), *base_, *lora, b, s, false);
  const uint64_t n = lora->parameter_count();
  const double l0 = loss(tf, *lora, true, 5, 0, 0);
  const std::vector<float> g0 = ctx().download<float>(lora->grads(), n);
  // the same seed: bit-identical loss and gradients
  EXPECT_EQ(loss(tf, *lora, true, 5, 0, 0), l0);
  EXPECT_EQ(ctx().download<float>(lora->grads(), n), g0);
  // another seed, step or micro-batch: other masks
  for (auto [seed, step, micro] : {std::tuple{6, 0, 0}, std::tuple{5, 1, 0}, std::tuple{5, 0, 1}}) {
    const double l = loss(tf, *lora, true, seed, step, micro);
    EXPECT_GT(std::abs(l - l0), 1e-5 * l0) << seed << " " << step << " " << micro;
  }
  // forward only (evaluation): no dropout, the loss of the same adapter with p = 0
  const double eval = loss(tf, *lora, false);
  auto plain = make_lora(0.0);
  model::Transformer tf0(ctx(), *base_, *plain, b, s, false);
  const double l_plain = loss(tf0, *plain, true);
  EXPECT_NEAR(eval, l_plain, 1e-6 * l_plain);
  EXPECT_GT(std::abs(l0 - l_plain), 1e-5 * l_plain);
  // the dropout scratch (one [tokens, hidden] fp32 buffer) is all the memory dropout adds
  EXPECT_GT(tf.activation_bytes(), tf0.activation_bytes());
  EXPECT_LE(tf.activation_bytes() - tf0.activation_bytes(),
            uint64_t(b) * s * uint64_t(config_.hidden_size) * 4 + 256);
}

TEST_F(DropoutEngine, BackwardRunNeedsAFreshSeed) {
  auto lora = make_lora(0.1);
  const auto [b, s] = shape();
  model::Transformer tf(ctx(), *base_, *lora, b, s, true);
  const model::TokenBatch& batch = batches_[0];
  EXPECT_THROW(tf.run(batch, 1.0f, loss_sum_, true), std::logic_error);
  tf.set_dropout_seed(1, 2, 3);
  tf.run(batch, 1.0f, loss_sum_, true);
  EXPECT_THROW(tf.run(batch, 1.0f, loss_sum_, true), std::logic_error);
  tf.run(batch, 1.0f, loss_sum_, false);  // evaluation needs no seed
}

TEST_F(DropoutEngine, ProbabilityOutsideZeroToOneIsAUserError) {
  for (double p : {-0.1, 1.0, 1.5}) {
    model::LoraSettings st = model::LoraSettings::from_peft(initial_.config);
    st.dropout = p;
    EXPECT_THROW(model::LoraSet(ctx(), config_, st), UserError) << p;
  }
}

}  // namespace
}  // namespace forja::test
