// RunConfig (YAML + flags, validation, "did you mean") and checkpoint files (atomic layout,
// round trip, pruning, resume resolution).
#include <gtest/gtest.h>

#include <fstream>

#include "io/adapter.h"
#include "train/checkpoint.h"
#include "train/run_config.h"
#include "util/error.h"
#include "util/nearest.h"

namespace forja::train {
namespace {
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("forja_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(RunConfig, FlagsOverrideYamlAndPathsAreRelativeToTheFile) {
  const fs::path d = fresh_dir("runcfg");
  std::ofstream(d / "run.yaml") << "model: m\nlora_rank: 8\nlr: 1e-4\nlora-targets: [q, v]\npacking: off\n";
  RunConfig c;
  c.load_yaml(d / "run.yaml");
  c.set("lr", "3e-4", "--lr");
  EXPECT_EQ(c.model, d / "m");
  EXPECT_EQ(c.lora_rank, 8);
  EXPECT_DOUBLE_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.lora_targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.packing, Toggle::off);
  EXPECT_EQ(c.explicitly_set.count("lora-rank"), 1u);
}

TEST(RunConfig, ResolvedYamlReadsBackToTheSameConfiguration) {
  const fs::path d = fresh_dir("runcfg_rt");
  RunConfig a;
  a.set("model", (d / "model dir: x").string(), "t");
  a.set("data", (d / "d.jsonl").string(), "t");
  a.set("out", (d / "o").string(), "t");
  a.set("lr-schedule", "cosine", "t");
  a.set("lora-targets", "gate,up,down", "t");
  a.set("rslora", "", "t");
  a.set("warmup-steps", "7", "t");
  std::ofstream(d / "config.yaml") << a.to_yaml();
  RunConfig b;
  b.load_yaml(d / "config.yaml");
  EXPECT_EQ(a.to_yaml(), b.to_yaml());
  EXPECT_TRUE(b.rslora);
  EXPECT_EQ(b.model, d / "model dir: x");
  // Paths YAML would misread if written plain (found by fuzz/fuzz_run_config.cpp: "mm :").
  for (const std::string name : {"mm :", "~", "null", "[x]", "&a", "*a", "-x", "a #b", "'q'", "{y}", "x: y", "%z", "!t"}) {
    RunConfig c;
    c.set("out", (d / name).string(), "t");
    std::ofstream(d / "config.yaml") << c.to_yaml();
    RunConfig back;
    EXPECT_EQ(error_of([&] { back.load_yaml(d / "config.yaml"); }), "") << name << "\n" << c.to_yaml();
    EXPECT_EQ(back.out, c.out) << c.to_yaml();
    EXPECT_EQ(back.to_yaml(), c.to_yaml()) << name;
  }
}

TEST(RunConfig, UnknownKeysSuggestTheNearestAndRangesAreChecked) {
  RunConfig c;
  EXPECT_NE(error_of([&] { c.set("lr-shedule", "cosine", "--lr-shedule"); }).find("did you mean 'lr-schedule'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.set("lr", "fast", "--lr"); }).find("not a number"), std::string::npos);
  EXPECT_NE(error_of([&] { c.set("quant", "int8", "--quant"); }).find("nf4, none"), std::string::npos);
  EXPECT_NE(error_of([&] { c.set("lora-targets", "q,z", "--lora-targets"); }).find("'z'"), std::string::npos);
  c.model = "m";
  c.data = "d";
  c.out = "o";
  EXPECT_EQ(error_of([&] { c.validate(); }), "");
  c.lora_rank = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("--lora-rank"), std::string::npos);
  c.lora_rank = 16;
  c.lr = -1;
  EXPECT_NE(error_of([&] { c.validate(); }).find("--lr"), std::string::npos);
  RunConfig missing;
  EXPECT_NE(error_of([&] { missing.validate(); }).find("--model is required"), std::string::npos);
  EXPECT_EQ(nearest_name("--bach-size", {"--batch-size", "--seq-len"}), "--batch-size");
  EXPECT_EQ(nearest_name("--colour", {"--batch-size", "--seq-len"}), "");
}

// Found by fuzz/fuzz_run_config.cpp: a list item or a key that is not a plain value made yaml-cpp
// throw its BadConversion, which escaped as a crash.
TEST(RunConfig, NestedListItemsAndKeysAreClearErrors) {
  const fs::path dir = fresh_dir("run_config_nested");
  auto load = [&](const std::string& text) {
    std::ofstream(dir / "run.yaml") << text;
    RunConfig c;
    return error_of([&] { c.load_yaml(dir / "run.yaml"); });
  };
  EXPECT_NE(load("lora_targets: [q, k, niv o,, model: modmmown]\n").find("lora_targets: expected a list of plain values"),
            std::string::npos);
  EXPECT_NE(load("lora-targets: [q, [k, v]]\n").find("expected a list of plain values"), std::string::npos);
  EXPECT_NE(load("[lr]: 2e-4\n").find("line 1: a setting's name must be a plain word"), std::string::npos);
  EXPECT_NE(load("{a: b}: 1\n").find("a setting's name must be a plain word"), std::string::npos);
  EXPECT_EQ(load("lora-targets: [q, k]\n"), "");
  // A control character in a value (here a NUL through a YAML escape) cannot go back to
  // config.yaml as it came: refused.
  EXPECT_NE(load("out: \"my run:\\b\\0 1\"\n").find("out: the value contains a control character"),
            std::string::npos);
  // Nor can bytes that are not UTF-8 (the emitter escapes them as characters).
  EXPECT_NE(load("model: mod\xC0\xC0=\x80(+\n").find("model: the value is not valid UTF-8 (at byte"), std::string::npos);
  EXPECT_EQ(load("model: caf\xC3\xA9\n"), "");
  fs::remove_all(dir);
}

TEST(RunConfig, WarmupAutoIsThreePercentRoundedUp) {
  RunConfig c;
  EXPECT_EQ(c.warmup_for(100), 3);
  EXPECT_EQ(c.warmup_for(10), 1);
  c.warmup_steps = 0;
  EXPECT_EQ(c.warmup_for(100), 0);
}

io::LoraTargetShapes tiny_shapes() {
  io::LoraTargetShapes s;
  s.num_layers = 2;
  s.targets = {{"q_proj", "self_attn.q_proj", 8, 4}, {"v_proj", "self_attn.v_proj", 8, 2}};
  return s;
}

Checkpoint tiny_checkpoint(int64_t step) {
  Checkpoint c;
  c.state.step = step;
  c.state.total_steps = 50;
  c.state.epoch = 1;
  c.state.batch_in_epoch = 3;
  c.state.tokens = 1234;
  c.state.elapsed_s = 1.5;
  c.state.seed = 7;
  c.adapter.config.r = 2;
  c.adapter.config.lora_alpha = 4;
  c.adapter.config.target_modules = {"q_proj", "v_proj"};
  float x = 0.25f;
  for (int64_t l = 0; l < 2; ++l)
    for (auto [name, out] : {std::pair<const char*, int>{"q_proj", 4}, {"v_proj", 2}}) {
      io::LoraWeights w;
      w.layer = l;
      w.target = name;
      for (int i = 0; i < 2 * 8; ++i) w.a.push_back(x += 0.5f);
      for (int i = 0; i < out * 2; ++i) w.b.push_back(x -= 0.125f);
      c.adapter.weights.push_back(w);
    }
  c.adam_m = {1, 2, 3, float(step)};
  c.adam_v = {4, 5, 6, 7};
  return c;
}

TEST(Checkpoint, RoundTripPruneAndResume) {
  const fs::path out = fresh_dir("ckpt");
  for (int64_t step : {4, 8, 12}) save_checkpoint(out, tiny_checkpoint(step), tiny_shapes(), "lr: 1\n");
  auto all = list_checkpoints(out);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.back().filename(), "checkpoint-12");
  const Checkpoint back = load_checkpoint(all.back(), tiny_shapes());
  const Checkpoint want = tiny_checkpoint(12);
  EXPECT_EQ(back.state.step, 12);
  EXPECT_EQ(back.state.batch_in_epoch, 3);
  EXPECT_EQ(back.state.tokens, 1234);
  EXPECT_EQ(back.adam_m, want.adam_m);
  EXPECT_EQ(back.adam_v, want.adam_v);
  ASSERT_EQ(back.adapter.weights.size(), want.adapter.weights.size());
  for (size_t i = 0; i < want.adapter.weights.size(); ++i) {
    EXPECT_EQ(back.adapter.weights[i].a, want.adapter.weights[i].a);
    EXPECT_EQ(back.adapter.weights[i].b, want.adapter.weights[i].b);
  }
  EXPECT_TRUE(fs::exists(all.back() / "config.yaml"));
  // saving the same step again replaces it whole
  save_checkpoint(out, tiny_checkpoint(12), tiny_shapes(), "lr: 2\n");
  EXPECT_EQ(list_checkpoints(out).size(), 3u);

  prune_checkpoints(out, 2);
  all = list_checkpoints(out);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.front().filename(), "checkpoint-8");
  EXPECT_EQ(resolve_resume(out), out / "checkpoint-12");
  EXPECT_EQ(resolve_resume(out / "checkpoint-8"), out / "checkpoint-8");

  fs::create_directories(out / ".checkpoint-16.partial");
  std::ofstream(out / ".adapter_model.safetensors.tmp.123.0") << "half";  // a killed run's temporary
  std::ofstream(out / ".hidden-by-the-user") << "kept";
  // killed between moving checkpoint-12 aside and moving its replacement in: it comes back
  fs::rename(out / "checkpoint-12", out / ".checkpoint-12.old");
  remove_partial_checkpoints(out);
  EXPECT_FALSE(fs::exists(out / ".checkpoint-16.partial"));
  EXPECT_FALSE(fs::exists(out / ".adapter_model.safetensors.tmp.123.0"));
  EXPECT_TRUE(fs::exists(out / ".hidden-by-the-user"));
  EXPECT_FALSE(fs::exists(out / ".checkpoint-12.old"));
  EXPECT_EQ(resolve_resume(out), out / "checkpoint-12");
  EXPECT_NE(error_of([&] { resolve_resume(fresh_dir("ckpt_empty")); }).find("no checkpoint"), std::string::npos);
}

TEST(Checkpoint, DamagedStateIsAClearError) {
  const fs::path out = fresh_dir("ckpt_bad");
  const fs::path dir = save_checkpoint(out, tiny_checkpoint(3), tiny_shapes(), "");
  std::ofstream(dir / "trainer_state.json") << "{\"format\": \"forja-trainer-state-1\", \"step\": 3}";
  EXPECT_NE(error_of([&] { load_checkpoint(dir, tiny_shapes()); }).find("damaged trainer state"), std::string::npos);
  // Found by fuzz/fuzz_checkpoint.cpp: an integer field holding a float beyond int64_t was cast
  // (undefined behaviour); now it, and any non-integer, is a damaged state.
  const std::string fields = R"("format": "forja-trainer-state-1", "step": 3, "total_steps": 10, "epoch": 0,
      "batch_in_epoch": 3, "tokens": 100, "elapsed_s": 1.5, "skipped_nonfinite": 0, "seed": 42)";
  std::ofstream(dir / "trainer_state.json") << "{" << fields << R"(, "micro_batches_per_step": 1e46})";
  EXPECT_NE(error_of([&] { load_checkpoint(dir, tiny_shapes()); }).find("\"micro_batches_per_step\" is not an integer"),
            std::string::npos);
  std::ofstream(dir / "trainer_state.json") << "{" << fields << R"(, "world_size": 2.5})";
  EXPECT_NE(error_of([&] { load_checkpoint(dir, tiny_shapes()); }).find("\"world_size\" is not an integer"),
            std::string::npos);
  std::ofstream(dir / "trainer_state.json") << R"({"format": "forja-trainer-state-1", "step": 3, "total_steps": 10,
      "epoch": 0, "batch_in_epoch": 3, "tokens": 100, "elapsed_s": 1.5, "skipped_nonfinite": 0, "seed": -1})";
  EXPECT_NE(error_of([&] { load_checkpoint(dir, tiny_shapes()); }).find("\"seed\""), std::string::npos);
}

}  // namespace
}  // namespace forja::train
