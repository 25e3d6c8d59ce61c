// The model-FLOP count of a training step (model/flops.h) against numbers worked out by hand.
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/flops.h"

namespace forja::model {
namespace {

// A small Qwen3-like config: V 512, H 64, I 128, L 2, 4 heads (2 kv) of 16.
ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  return c;
}

const std::vector<LinearKind> kAll(std::begin(kAllLinears), std::end(kAllLinears));

TEST(TrainingStepFlops, SmallConfigByHand) {
  // Per layer (out x in): q 64x64 = 4096, k 32x64 = 2048, v 2048, o 64x64 = 4096,
  // gate/up 128x64 = 8192 each, down 64x128 = 8192: 36864; two layers 73728. LM head 512x64 = 32768.
  // T = 2 x 8 = 16 tokens.
  // base forward = 2 * 16 * (73728 + 32768) = 3,407,872; base backward the same.
  // LoRA r = 8, r * (in + out) per layer: q 8*128 = 1024, k 8*96 = 768, v 768, o 1024,
  //   gate/up/down 8*192 = 1536 each: 8192 per layer, 16384 in all; 6 * 16 * 16384 = 1,572,864.
  // attention = 6 * L 2 * B 2 * S^2 64 * heads 4 * d 16 = 98,304.
  const StepFlops f = training_step_flops(small_config(), 2, 8, 8, kAll);
  EXPECT_DOUBLE_EQ(f.base_forward, 3407872.0);
  EXPECT_DOUBLE_EQ(f.base_backward, 3407872.0);
  EXPECT_DOUBLE_EQ(f.lora, 1572864.0);
  EXPECT_DOUBLE_EQ(f.attention, 98304.0);
  EXPECT_DOUBLE_EQ(f.total(), 8486912.0);
}

TEST(TrainingStepFlops, TargetsRankAndSequenceLength) {
  // LoRA on q and v only, r = 4: per layer 4*128 + 4*96 = 896, two layers 1792;
  // T = 1 x 32 = 32: 6 * 32 * 1792 = 344,064.
  const StepFlops f = training_step_flops(small_config(), 1, 32, 4, {LinearKind::Q, LinearKind::V});
  EXPECT_DOUBLE_EQ(f.lora, 344064.0);
  // base: 2 * 32 * 106496 = 6,815,744; attention: 6 * 2 * 1 * 1024 * 4 * 16 = 786,432.
  EXPECT_DOUBLE_EQ(f.base_forward, 6815744.0);
  EXPECT_DOUBLE_EQ(f.attention, 786432.0);
  // An untied LM head costs the same product as a tied one.
  ModelConfig untied = small_config();
  untied.tie_word_embeddings = false;
  EXPECT_DOUBLE_EQ(training_step_flops(untied, 1, 32, 4, {LinearKind::Q}).base_forward, f.base_forward);
}

}  // namespace
}  // namespace forja::model
