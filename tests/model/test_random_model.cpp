// Random models for `forja bench` (model/random_model.h): the named shapes against the released
// Qwen3 sizes, the value streams (independent of how they are read, seeded, with the intended
// statistics), valid NF4 tensors, token batches, and base weights on the GPU (shapes and
// determinism from the seed).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "model/config_fixtures.h"
#include "quant/nf4.h"
#include "model/random_model.h"
#include "support/gpu_fixture.h"
#include "util/error.h"

namespace forja::model {
namespace {

TEST(BenchShapes, MatchTheReleasedQwen3Sizes) {
  // Non-embedding parameters as the model cards give them: 0.44B, 3.6B, 6.95B (projections
  // only; norms add a few hundred thousand).
  EXPECT_EQ(count_parameters(bench_shape_config("qwen3-0.6b")).linear, 440401920);
  EXPECT_EQ(count_parameters(bench_shape_config("qwen3-4b")).linear, 3633315840);
  EXPECT_EQ(count_parameters(bench_shape_config("qwen3-8b")).linear, 6945767424);
  for (const std::string& name : bench_shape_names()) {
    const ModelConfig c = bench_shape_config(name);
    EXPECT_EQ(c.architecture, Architecture::Qwen3) << name;
    EXPECT_TRUE(c.qk_norm) << name;
    EXPECT_EQ(c.hidden_size % c.num_heads, 0) << name;
    EXPECT_EQ(c.num_heads % c.num_kv_heads, 0) << name;
    EXPECT_EQ(rope_inv_freq(c).size(), size_t(c.head_dim / 2)) << name;
  }
  const ModelConfig big = bench_shape_config("qwen3-8b");
  EXPECT_FALSE(big.tie_word_embeddings);
  EXPECT_EQ(big.vocab_size, 151936);
  EXPECT_EQ(big.head_dim, 128);
  EXPECT_EQ(big.rope_theta, 1e6);
  EXPECT_TRUE(bench_shape_config("qwen3-4b").tie_word_embeddings);
}

TEST(BenchShapes, SameArchitectureAsTheQwen3ConfigFixtures) {
  const std::pair<const char*, std::string> cases[] = {
      {"qwen3-0.6b", test::qwen3_0_6b()}, {"qwen3-4b", test::qwen3_4b()}, {"qwen3-8b", test::qwen3_8b()}};
  for (const auto& [name, json] : cases) {
    const ModelConfig want = parse_model_config(json, "config.json"), got = bench_shape_config(name);
    EXPECT_EQ(got.architecture, want.architecture) << name;
    EXPECT_EQ(got.vocab_size, want.vocab_size) << name;
    EXPECT_EQ(got.hidden_size, want.hidden_size) << name;
    EXPECT_EQ(got.intermediate_size, want.intermediate_size) << name;
    EXPECT_EQ(got.num_layers, want.num_layers) << name;
    EXPECT_EQ(got.num_heads, want.num_heads) << name;
    EXPECT_EQ(got.num_kv_heads, want.num_kv_heads) << name;
    EXPECT_EQ(got.head_dim, want.head_dim) << name;
    EXPECT_EQ(got.rms_norm_eps, want.rms_norm_eps) << name;
    EXPECT_EQ(got.rope_theta, want.rope_theta) << name;
    EXPECT_EQ(got.max_position_embeddings, want.max_position_embeddings) << name;
    EXPECT_EQ(got.tie_word_embeddings, want.tie_word_embeddings) << name;
    EXPECT_EQ(got.qk_norm, want.qk_norm) << name;
    EXPECT_EQ(got.qkv_bias || got.o_bias || got.mlp_bias, false) << name;
    EXPECT_EQ(rope_inv_freq(got), rope_inv_freq(want)) << name;
  }
}

TEST(BenchShapes, UnknownShapeListsTheValidOnes) {
  try {
    bench_shape_config("qwen3-14b");
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("qwen3-14b"), std::string::npos) << m;
    for (const std::string& name : bench_shape_names()) EXPECT_NE(m.find(name), std::string::npos) << m;
  }
}

TEST(RandomNormal, SameValuesWhateverTheRangeAndSeeded) {
  std::vector<float> whole(1001), part(301), other(1001);
  random_normal(7, 0, whole, 0.02f);
  random_normal(7, 333, part, 0.02f);  // odd start: the second half of a Box-Muller pair
  for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], whole[333 + i]) << i;
  random_normal(8, 0, other, 0.02f);
  EXPECT_NE(whole, other);
}

TEST(RandomNormal, MeanAndStandardDeviation) {
  // Large enough to be split over threads.
  std::vector<float> v(1 << 20);
  random_normal(1, 0, v, 0.02f);
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += double(x) * x;
  }
  const double mean = sum / v.size(), sd = std::sqrt(sq / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(sd, 0.02, 2e-4);
  std::vector<float> again(v.size());
  random_normal(1, 0, again, 0.02f);
  EXPECT_EQ(v, again);
}

TEST(RandomNf4, ValidTensorWithSaneValues) {
  for (bool dq : {true, false}) {
    const quant::Nf4Tensor t = random_nf4_tensor({96, 640}, 3, dq);  // 960 blocks: several nested blocks
    EXPECT_EQ(t.numel, 96 * 640);
    EXPECT_EQ(t.packed.size(), size_t(96 * 640 / 2));
    EXPECT_EQ(t.double_quant, dq);
    if (dq) {
      EXPECT_EQ(t.absmax_q.size(), 960u);
      EXPECT_EQ(t.nested_absmax.size(), 4u);
      EXPECT_TRUE(t.absmax.empty());
    } else {
      EXPECT_EQ(t.absmax.size(), 960u);
    }
    for (float a : t.decoded_absmax()) {
      EXPECT_GT(a, 0.043f);
      EXPECT_LT(a, 0.057f);
    }
    const std::vector<float> w = quant::nf4_dequantize(t);
    double sq = 0;
    for (float x : w) sq += double(x) * x;
    const double rms = std::sqrt(sq / w.size());
    // uniform codes: rms = absmax * sqrt(mean of code^2) ~ 0.05 * 0.52
    EXPECT_GT(rms, 0.022);
    EXPECT_LT(rms, 0.030);
    // every code occurs about equally often (3840 each)
    std::vector<int> hist(16);
    for (uint8_t byte : t.packed) {
      ++hist[byte >> 4];
      ++hist[byte & 15];
    }
    for (int h : hist) EXPECT_NEAR(h, 96 * 640 / 16, 500);
  }
  EXPECT_EQ(random_nf4_tensor({64, 64}, 3, true).packed, random_nf4_tensor({64, 64}, 3, true).packed);
  EXPECT_NE(random_nf4_tensor({64, 64}, 3, true).packed, random_nf4_tensor({64, 64}, 4, true).packed);
  // An odd count leaves the padding nibble at the code of 0.0, as bitsandbytes writes it.
  EXPECT_EQ(random_nf4_tensor({1, 65}, 3, true).packed.back() & 15, 7);
}

TEST(RandomTokenBatch, ShiftedTargetsOneDocumentPerRow) {
  const TokenBatch b = random_token_batch(3, 5, 11, 9);
  ASSERT_EQ(b.input_ids.size(), 15u);
  for (uint32_t r = 0; r < 3; ++r)
    for (uint32_t s = 0; s < 5; ++s) {
      const size_t i = r * 5 + s;
      EXPECT_GE(b.input_ids[i], 0);
      EXPECT_LT(b.input_ids[i], 11);
      EXPECT_EQ(b.targets[i], s + 1 < 5 ? b.input_ids[i + 1] : -100);
      EXPECT_EQ(b.positions[i], int32_t(s));
      EXPECT_EQ(b.segments[i], 1);
    }
  EXPECT_EQ(b.target_count(), 12u);
  EXPECT_EQ(random_token_batch(3, 5, 11, 9).input_ids, b.input_ids);
  EXPECT_NE(random_token_batch(3, 5, 11, 10).input_ids, b.input_ids);
}

class RandomBaseWeights : public test::GpuTest {};

TEST_F(RandomBaseWeights, ShapesAndDeterminismFromTheSeed) {
  const ModelConfig c = bench_shape_config("tiny");
  for (BaseQuant quant : {BaseQuant::nf4, BaseQuant::none}) {
    BaseWeightOptions options;
    options.quant = quant;
    BaseWeights a = random_base_weights(ctx(), c, options, 5);
    BaseWeights b = random_base_weights(ctx(), c, options, 5);
    BaseWeights other = random_base_weights(ctx(), c, options, 6);
    const uint64_t V = c.vocab_size, H = c.hidden_size;
    ASSERT_EQ(a.layers.size(), size_t(c.num_layers));
    EXPECT_GE(a.embedding.size, V * H * 4);
    EXPECT_EQ(a.lm_head.buffer, a.embedding.buffer);  // tied
    EXPECT_EQ(a.lm_head.offset, a.embedding.offset);
    const std::vector<float> emb = ctx().download<float>(a.embedding, V * H);
    EXPECT_EQ(emb, ctx().download<float>(b.embedding, V * H));
    EXPECT_NE(emb, ctx().download<float>(other.embedding, V * H));
    // the embedding is the normal(0, 0.02) stream its name and the seed select
    double sq = 0;
    for (float x : emb) sq += double(x) * x;
    EXPECT_NEAR(std::sqrt(sq / emb.size()), 0.02, 0.001);
    EXPECT_EQ(ctx().download<float>(a.final_norm, H), std::vector<float>(H, 1.0f));
    for (size_t i = 0; i < a.layers.size(); ++i) {
      const BaseLayer& la = a.layers[i];
      EXPECT_EQ(ctx().download<float>(la.input_norm, H), std::vector<float>(H, 1.0f));
      EXPECT_EQ(ctx().download<float>(la.k_norm, c.head_dim), std::vector<float>(c.head_dim, 1.0f));
      for (LinearKind k : kAllLinears) {
        const BaseLinear& la_k = la.linears[int(k)];
        const BaseLinear& lb_k = b.layers[i].linears[int(k)];
        const BaseLinear& lo_k = other.layers[i].linears[int(k)];
        const LinearShape s = linear_shape(c, k);
        EXPECT_EQ(la_k.out, uint32_t(s.out_features));
        EXPECT_EQ(la_k.in, uint32_t(s.in_features));
        EXPECT_FALSE(la_k.bias.valid());
        const uint64_t n = uint64_t(s.out_features) * s.in_features;
        if (quant == BaseQuant::nf4) {
          ASSERT_TRUE(la_k.nf4.has_value());
          EXPECT_EQ(la_k.nf4->rows, la_k.out);
          EXPECT_EQ(la_k.nf4->cols, la_k.in);
          EXPECT_TRUE(la_k.nf4->double_quant);
          const auto pa = ctx().download<uint8_t>(la_k.nf4->packed, n / 2);
          EXPECT_EQ(pa, ctx().download<uint8_t>(lb_k.nf4->packed, n / 2));
          EXPECT_NE(pa, ctx().download<uint8_t>(lo_k.nf4->packed, n / 2));
        } else {
          ASSERT_FALSE(la_k.nf4.has_value());
          EXPECT_EQ(la_k.dense_dtype, ops::DType::f32);
          const auto wa = ctx().download<float>(la_k.dense, n);
          EXPECT_EQ(wa, ctx().download<float>(lb_k.dense, n));
          EXPECT_NE(wa, ctx().download<float>(lo_k.dense, n));
          EXPECT_NE(wa, emb.size() >= n ? std::vector<float>(emb.begin(), emb.begin() + n) : emb)
              << "each tensor has its own stream";
        }
      }
    }
    free_base_weights(ctx(), a);
    free_base_weights(ctx(), b);
    free_base_weights(ctx(), other);
  }
}

}  // namespace
}  // namespace forja::model
