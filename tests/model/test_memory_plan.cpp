// Memory plan: weight bytes against the figures of docs/formats.md §3.4, the NF4 byte formula
// against real quantised tensors, and the training estimate's structure.
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <random>

#include "model/config_fixtures.h"
#include "model/memory_plan.h"
#include "ops/attention_gemm.h"
#include "quant/nf4.h"

namespace forja::model {
namespace {

ModelConfig parse(const std::string& text) { return parse_model_config(text, "config.json"); }

// The bytes of the plan's part `name`, 0 when it has none.
std::uint64_t part(const MemoryPlan& p, const std::string& name) {
  for (const MemoryPart& m : p.parts)
    if (m.name == name) return m.bytes;
  return 0;
}

TEST(MemoryPlan, Nf4BytesMatchQuantisedTensors) {
  for (std::int64_t n : {1, 63, 64, 65, 64 * 256, 64 * 256 + 1, 100000}) {
    std::vector<float> w(static_cast<std::size_t>(n), 0.25f);
    for (bool dq : {false, true}) {
      quant::Nf4Tensor t = quant::nf4_quantize(w, {n}, {.double_quant = dq, .threads = 1});
      EXPECT_EQ(nf4_bytes(n, dq), t.storage_bytes()) << n << " dq " << dq;
    }
  }
}

TEST(MemoryPlan, LinearWeightsMatchFormatsDoc) {
  // formats.md §3.4: linear layers only, 4.5 bits/param and 4.127 with double quantisation.
  struct Case {
    std::string config;
    double linear_params_b, nf4_gb, dq_gb;
  };
  for (const Case& k :
       {Case{test::qwen3_0_6b(), 0.44, 0.248, 0.227}, Case{test::qwen3_1_7b(), 1.41, 0.79, 0.73},
        Case{test::qwen3_4b(), 3.63, 2.04, 1.87}, Case{test::qwen3_8b(), 6.95, 3.91, 3.58}}) {
    ModelConfig c = parse(k.config);
    WeightBytes w = weight_bytes(c);
    EXPECT_NEAR(count_parameters(c).linear / 1e9, k.linear_params_b, 0.006) << c.hidden_size;
    EXPECT_NEAR(w.linear_nf4 / 1e9, k.nf4_gb, 0.006) << c.hidden_size;
    EXPECT_NEAR(w.linear_nf4_dq / 1e9, k.dq_gb, 0.006) << c.hidden_size;
    EXPECT_EQ(w.linear_16bit, 2u * static_cast<std::uint64_t>(count_parameters(c).linear));
  }
  // The acceptance figure: Qwen3-4B NF4 linears with DQ at about 1.87 GB.
  EXPECT_NEAR(weight_bytes(parse(test::qwen3_4b())).linear_nf4_dq / 1e9, 1.874, 0.002);
}

TEST(MemoryPlan, TiedHeadCostsNothingExtra) {
  EXPECT_EQ(weight_bytes(parse(test::qwen3_4b())).lm_head_16bit, 0u);
  EXPECT_EQ(weight_bytes(parse(test::qwen3_8b())).lm_head_16bit, 2u * 151936 * 4096);
}

TEST(MemoryPlan, TrainingEstimateParts) {
  ModelConfig c = parse(test::qwen3_4b());
  TrainingSettings s;
  s.batch = 1;
  s.seq_len = 2048;
  s.lora_rank = 16;
  MemoryPlan on = plan_training_memory(c, s);
  EXPECT_EQ(on.lora_parameters, lora_parameter_count(c, 16, s.targets));
  EXPECT_EQ(part(on, "LoRA parameters (fp32)"), 4u * on.lora_parameters);
  EXPECT_EQ(part(on, "AdamW moments (fp32)"), 8u * on.lora_parameters);
  EXPECT_EQ(part(on, "NF4 linear weights"), weight_bytes(c).linear_nf4_dq);

  s.checkpointing = false;
  MemoryPlan off = plan_training_memory(c, s);
  EXPECT_GT(part(off, "saved activations"), 5 * part(on, "saved activations"));
  // Activations scale linearly with tokens.
  s.batch = 2;
  MemoryPlan off2 = plan_training_memory(c, s);
  EXPECT_EQ(part(off2, "saved activations"), 2 * part(off, "saved activations"));
  // Without checkpointing a 4B model at 2048 tokens needs several GB; with it, well under that.
  EXPECT_GT(off.total(), on.total());
  EXPECT_LT(on.total() / 1e9, 6.0);
  EXPECT_GT(on.total() / 1e9, 2.6);
  // LoRA dropout adds one fp32 [tokens, hidden] scratch, nothing per layer.
  TrainingSettings d = s;
  d.lora_dropout = 0.1;
  const MemoryPlan with_dropout = plan_training_memory(c, d);
  EXPECT_EQ(with_dropout.total() - plan_training_memory(c, s).total(),
            4u * std::uint64_t(d.batch * d.seq_len) * std::uint64_t(c.hidden_size));
}

TEST(MemoryPlan, DenseAndFp32Weights) {
  // forja bench in fp32: embedding and LM head in fp32, projections NF4 or dense fp32.
  ModelConfig c = parse(test::qwen3_8b());
  const WeightBytes w = weight_bytes(c);
  TrainingSettings s;
  const MemoryPlan sixteen = plan_training_memory(c, s);
  EXPECT_EQ(part(sixteen, "embedding (16-bit)"), 2u * 151936 * 4096);
  s.dense_weight_bytes = 4;
  const MemoryPlan nf4 = plan_training_memory(c, s);
  EXPECT_EQ(part(nf4, "embedding (32-bit)"), 4u * 151936 * 4096);
  EXPECT_EQ(part(nf4, "LM head (32-bit)"), 4u * 151936 * 4096);
  EXPECT_EQ(part(nf4, "NF4 linear weights"), w.linear_nf4_dq);
  s.nf4 = false;
  const MemoryPlan dense = plan_training_memory(c, s);
  EXPECT_EQ(part(dense, "linear weights (32-bit)"), 4u * static_cast<std::uint64_t>(count_parameters(c).linear));
  EXPECT_EQ(dense.total() - nf4.total(), 2 * w.linear_16bit - w.linear_nf4_dq);
}

// Mixed precision's transient scratch: the GEMM path's chunk of scores for attention (a 4B model at
// 2048 tokens: half a GB), the fused kernels' fp16 copies, the dk/dv kernel's partial sums and
// the dS that dq is taken from when the backward is fused (about 250 MB for one sequence, under
// half the GEMM path's).
TEST(MemoryPlan, FusedAttentionBackwardNeedsOnlyItsCopies) {
  ModelConfig c = parse(test::qwen3_4b());
  TrainingSettings s;
  s.batch = 1;
  s.seq_len = 2048;
  auto scratch = [](const MemoryPlan& p) {
    for (auto& m : p.parts)
      if (m.name == "scratch (transient)") return m;
    ADD_FAILURE() << "no scratch";
    return MemoryPart{};
  };
  const MemoryPart gemm = scratch(plan_training_memory(c, s));
  EXPECT_EQ(gemm.bytes, ops::attention_gemm_scratch_bytes(2048, 32, 128, 512));
  s.fused_attention_backward = true;
  const MemoryPart fused = scratch(plan_training_memory(c, s));
  EXPECT_LT(fused.bytes, gemm.bytes / 2);
  EXPECT_EQ(fused.bytes, ops::attention_fused_scratch_bytes(1, 2048, 32, 8, 128));
  EXPECT_EQ(fused.note, "attention: the fused kernels' fp16 copies");
  // q and dout (32 heads), k and v (8 heads) in fp16, D in fp32, and the dk/dv kernel's partial
  // sums: one sequence gives 32 key tiles x 8 kv heads = 256 workgroups (128 with two tiles per
  // workgroup), so 4 share each kv head; dS of 32 heads in blocks of 64 queries (block t holds
  // 64 (t + 1) keys a row: 64 x 64 x 32 x 33 / 2 halves a head)
  EXPECT_EQ(ops::attention_dkv_split(1, 2048, 32, 8), 4u);
  const std::uint64_t ds = 32u * 64 * 64 * (32 * 33 / 2) * 2;
  EXPECT_EQ(ops::attention_ds_bytes(1, 2048, 32, ops::AttentionGemmOptions{}.fused_backward_tiles), ds);
  EXPECT_EQ(ops::attention_fused_scratch_bytes(1, 2048, 32, 8, 128),
            2u * 2048 * 32 * 128 * 2 + 2u * 2048 * 8 * 128 * 2 + 2048u * 32 * 4 + 2u * 4 * 2048 * 8 * 128 * 4 +
                (ops::attention_dq_from_ds_default() ? ds : 0));
  ops::AttentionGemmOptions single, paired;  // one or two row tiles per workgroup
  single.fused_backward_tiles.paired = false;
  paired.fused_backward_tiles.paired = true;
  EXPECT_EQ(ops::attention_dkv_split(8, 2048, 32, 8, single), 1u);  // 2048 workgroups
  EXPECT_EQ(ops::attention_dkv_split(8, 2048, 32, 8, paired), 1u);  // 1024
  EXPECT_EQ(ops::attention_dkv_split(4, 512, 32, 8, single), 4u);   // 256
  EXPECT_EQ(ops::attention_dkv_split(2, 512, 32, 8, single), 4u);   // 128: all 4 query heads, 512
  EXPECT_EQ(ops::attention_dkv_split(1, 2048, 24, 8, single), 3u);  // 3 query heads per kv head: 768
  EXPECT_EQ(ops::attention_dkv_split(1, 2048, 40, 8, single), 5u);  // 5: 1280
  EXPECT_EQ(ops::attention_dkv_split(4, 2048, 32, 8, single), 1u);  // 1024
  EXPECT_EQ(ops::attention_dkv_split(4, 2048, 32, 8, paired), 2u);  // 512: two share each kv head
  s.batch = 4;
  EXPECT_GE(scratch(plan_training_memory(c, s)).bytes, ops::attention_fused_scratch_bytes(4, 2048, 32, 8, 128));
}

// Attention outputs kept across checkpointing (keeps_attention_outputs): mixed precision with
// the fused backward and checkpointing, no LoRA dropout, o_proj's LoRA folded (NF4) or absent;
// per layer and token the fp16 copy o_proj reads (q_dim + the fold's 64 halves) and the fp32 lse
// of each head. choose_kept_activations drops them where the plan would pass 3/4 of the device.
TEST(MemoryPlan, KeptAttentionOutputs) {
  ModelConfig c = parse(test::qwen3_4b());
  TrainingSettings s;
  s.batch = 1;
  s.seq_len = 2048;
  s.fused_attention_backward = true;
  auto kept = [](const MemoryPlan& p) { return part(p, "attention outputs kept"); };
  ASSERT_TRUE(keeps_attention_outputs(c, s));
  const MemoryPlan with = plan_training_memory(c, s);
  EXPECT_EQ(kept(with), 36u * 2048 * ((4096 + 64) * 2 + 32 * 4));  // 594 MiB
  TrainingSettings off = s;
  off.keep_attention = false;
  EXPECT_EQ(with.total() - plan_training_memory(c, off).total(), kept(with));
  EXPECT_LT(with.total() / double(1ull << 30), 6.0);  // issue 14's 1x2048 budget
  for (auto change : std::initializer_list<void (*)(TrainingSettings&)>{
           [](TrainingSettings& t) { t.checkpointing = false; }, [](TrainingSettings& t) { t.lora_dropout = 0.05; },
           [](TrainingSettings& t) { t.fused_attention_backward = false; },
           [](TrainingSettings& t) { t.dense_weight_bytes = 4; }, [](TrainingSettings& t) { t.nf4 = false; }}) {
    TrainingSettings t = s;
    change(t);
    EXPECT_FALSE(keeps_attention_outputs(c, t));
    EXPECT_EQ(kept(plan_training_memory(c, t)), 0u);
  }
  TrainingSettings dense_no_o = s;  // dense weights, no LoRA on o_proj: its product reads the copy as it is
  dense_no_o.nf4 = false;
  dense_no_o.targets = {LinearKind::Q, LinearKind::V};
  EXPECT_TRUE(keeps_attention_outputs(c, dense_no_o));

  TrainingSettings chosen = s;
  choose_kept_activations(c, chosen, 80ull << 30);
  EXPECT_TRUE(chosen.keep_attention);
  choose_kept_activations(c, chosen, 0);  // unknown memory: as asked
  EXPECT_TRUE(chosen.keep_attention);
  const std::uint64_t need = with.total();
  choose_kept_activations(c, chosen, need / 3 * 4 + 8);
  EXPECT_TRUE(chosen.keep_attention);
  choose_kept_activations(c, chosen, need / 3 * 4 - 8);
  EXPECT_FALSE(chosen.keep_attention);
  chosen.keep_attention = true;
  ::setenv("FORJA_KEEP_ATTENTION", "0", 1);
  choose_kept_activations(c, chosen, 80ull << 30);
  ::unsetenv("FORJA_KEEP_ATTENTION");
  EXPECT_FALSE(chosen.keep_attention);
}

// The LoRA inputs kept across checkpointing (keeps_lora_inputs): t = x A^T of every layer, fp32,
// targets x rank per token; with checkpointing and LoRA only. choose_kept_activations drops them
// for FORJA_KEEP_LORA_INPUTS=0 and leaves them otherwise.
TEST(MemoryPlan, KeptLoraInputs) {
  ModelConfig c = parse(test::qwen3_4b());
  TrainingSettings s;
  s.batch = 1;
  s.seq_len = 2048;
  auto kept = [](const MemoryPlan& p) { return part(p, "LoRA inputs kept"); };
  ASSERT_TRUE(keeps_lora_inputs(c, s));
  const MemoryPlan with = plan_training_memory(c, s);
  EXPECT_EQ(kept(with), 36u * 2048 * (7 * 16) * 4);  // 31.5 MiB
  TrainingSettings off = s;
  off.keep_lora_inputs = false;
  EXPECT_FALSE(keeps_lora_inputs(c, off));
  EXPECT_EQ(with.total() - plan_training_memory(c, off).total(), kept(with));
  for (auto change : std::initializer_list<void (*)(TrainingSettings&)>{
           [](TrainingSettings& t) { t.checkpointing = false; }, [](TrainingSettings& t) { t.targets.clear(); },
           [](TrainingSettings& t) { t.lora_rank = 0; }}) {
    TrainingSettings t = s;
    change(t);
    EXPECT_FALSE(keeps_lora_inputs(c, t));
    EXPECT_EQ(kept(plan_training_memory(c, t)), 0u);
  }
  TrainingSettings two = s;  // the width follows the targets
  two.targets = {LinearKind::Q, LinearKind::V};
  EXPECT_EQ(kept(plan_training_memory(c, two)), 36u * 2048 * (2 * 16) * 4);

  TrainingSettings chosen = s;
  choose_kept_activations(c, chosen, 1ull << 20);  // no memory rule: as asked
  EXPECT_TRUE(chosen.keep_lora_inputs);
  ::setenv("FORJA_KEEP_LORA_INPUTS", "0", 1);
  choose_kept_activations(c, chosen, 80ull << 30);
  ::unsetenv("FORJA_KEEP_LORA_INPUTS");
  EXPECT_FALSE(chosen.keep_lora_inputs);
}

}  // namespace
}  // namespace forja::model
