// `forja train` end to end on the built-in example model (lavapipe in CI): the loss falls, the
// outputs are there, a run killed (SIGKILL in the middle of writing a checkpoint, or SIGTERM)
// and resumed gives exactly the losses of the uninterrupted run, and user errors exit 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "train/example.h"
#include "support/cli_runner.h"
#include "support/example_run.h"

namespace forja::train {
namespace {
namespace fs = std::filesystem;

using forja::test::program;

struct Result {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;
};

Result run(const std::string& args, const std::string& env = "") {
  const forja::test::ShellResult s = forja::test::run_shell(env + " " + program() + " " + args + " 2>&1");
  Result r;
  r.exit_code = s.exit_code;
  r.output = s.output;
  if (r.exit_code > 128) r.signal = r.exit_code - 128;  // the shell's report of a signal
  return r;
}

// The example model and data, made once per test process.
using Example = forja::test::ExampleFiles;
const Example& example() {
  static const Example files = forja::test::make_example_files("train_cli", 3);
  return files;
}

std::string base_args(const fs::path& out) {
  const Example& e = example();
  return "train --model " + e.model.string() + " --data " + e.data.string() + " --out " + out.string() +
         " --seq-len 48 --batch-size 4 --grad-accum 2 --max-steps 8 --lr 3e-3 --warmup-steps 2 --lr-schedule cosine"
         " --save-every 3 --keep-checkpoints 2 --log-every 1 --lora-rank 8";
}

std::map<int64_t, double> losses(const fs::path& out) { return forja::test::logged_losses(out); }

TEST(TrainCli, TrainsWritesOutputsAndResumesExactlyAfterKills) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path dir = example().dir;

  // 1. uninterrupted
  const fs::path a = dir / "run_a";
  Result r = run(base_args(a));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = losses(a);
  ASSERT_EQ(want.size(), 8u) << r.output;
  EXPECT_LT(want.at(8), want.at(1) - 0.2) << "the loss should fall";
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json", "config.yaml", "metrics.jsonl"})
    EXPECT_TRUE(fs::exists(a / f)) << f;
  EXPECT_FALSE(fs::exists(a / "checkpoint-3"));  // kept: the newest 2
  EXPECT_TRUE(fs::exists(a / "checkpoint-6"));
  EXPECT_TRUE(fs::exists(a / "checkpoint-8"));

  // 2. SIGKILL half-way through writing checkpoint-6, then resume
  const fs::path b = dir / "run_b";
  r = run(base_args(b), "FORJA_TEST_KILL_IN_CHECKPOINT=6");
  EXPECT_EQ(r.signal, 9) << r.output;
  EXPECT_TRUE(fs::exists(b / "checkpoint-3"));
  EXPECT_FALSE(fs::exists(b / "checkpoint-6"));
  r = run("train --resume " + b.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from"), std::string::npos) << r.output;
  EXPECT_EQ(losses(b), want) << r.output;

  // 3. SIGTERM after step 3 (raised by the process itself through a test hook, so a fast GPU
  // cannot finish first) saves a checkpoint and exits 0; resume from the run directory
  const fs::path c = dir / "run_c";
  r = run(base_args(c) + " --save-every 0", "FORJA_TEST_SIGTERM_AFTER_STEP=3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stopped by a signal at step 3"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(c / "checkpoint-3")) << r.output;
  r = run("train --resume " + c.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses(c), want) << r.output;

  // 4. --init-adapter continues from a trained adapter: its first loss is the trained one's level
  const fs::path d = dir / "run_d";
  r = run(base_args(d) + " --max-steps 1 --init-adapter " + a.string() + " --lora-rank 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(losses(d).at(1), want.at(1) - 0.2) << r.output;
}

TEST(TrainCli, UserErrorsExitTwoWithOneLine) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path dir = example().dir;
  const fs::path out = dir / "run_errors";
  auto expect_error = [&](const std::string& args, const std::string& needle) {
    const Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  };
  expect_error(base_args(out) + " --lora-rank 0", "--lora-rank must be");
  expect_error(base_args(out) + " --lr -1", "--lr must be");
  expect_error(base_args(out) + " --lr-shedule cosine", "did you mean '--lr-schedule'");
  expect_error("train --model " + (dir / "nope").string() + " --data " + example().data.string() + " --out " + out.string(),
               "no such model directory");
  expect_error(base_args(out) + " --init-adapter " + (dir / "nope").string(), "nope");
  std::ofstream(dir / "bad.yaml") << "lora-rnak: 4\n";
  expect_error(base_args(out) + " --config " + (dir / "bad.yaml").string(), "did you mean 'lora-rank'");

  // an OUT holding another run is refused unless --resume or --overwrite
  const Result first = run(base_args(out) + " --max-steps 1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  expect_error(base_args(out) + " --max-steps 1", "holds another run");
  const Result again = run(base_args(out) + " --max-steps 1 --overwrite");
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

// A copy of the example model in example().dir / name, with `change` applied to the bf16 data of
// each tensor (its name, its values as bf16 bit patterns).
fs::path changed_model(const std::string& name,
                       const std::function<void(const std::string&, std::vector<uint16_t>&)>& change) {
  const fs::path dir = example().dir / name;
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(example().model))
    if (e.path().filename() != "model.safetensors") fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  const auto src = io::SafetensorsFile::open(example().model / "model.safetensors");
  std::vector<std::vector<uint16_t>> changed;
  changed.reserve(src.tensors().size());
  std::vector<io::TensorToWrite> out;
  for (const auto& info : src.tensors()) {
    io::TensorToWrite t;
    t.name = info.name;
    t.dtype = info.dtype;
    t.shape = info.shape;
    t.data = src.view(info).bytes();
    if (info.dtype == io::Dtype::BF16) {
      changed.emplace_back(size_t(info.numel()));
      std::memcpy(changed.back().data(), t.data.data(), t.data.size());
      change(info.name, changed.back());
      t.data = std::as_bytes(std::span(changed.back()));
    }
    out.push_back(std::move(t));
  }
  io::write_safetensors(dir / "model.safetensors", std::move(out));
  return dir;
}

// The example model whose final norm holds a NaN: every loss is NaN.
fs::path nan_model() {
  return changed_model("nan_model", [](const std::string& name, std::vector<uint16_t>& v) {
    if (name != "model.norm.weight") return;
    v.assign(v.size(), 0x3F80);  // bf16 1.0
    v[1] = 0x7FC0;               // bf16 NaN
  });
}

TEST(TrainCli, NonFiniteLossStopsOrIsSkipped) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path model = nan_model();
  const std::string args = "train --model " + model.string() + " --data " + example().data.string() +
                           " --seq-len 48 --batch-size 2 --grad-accum 1 --max-steps 2 --log-every 1 --out ";
  Result r = run(args + (example().dir / "run_nan").string());
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("not finite"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--skip-nonfinite"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(example().dir / "run_nan" / "adapter_model.safetensors"));
  r = run(args + (example().dir / "run_nan_skip").string() + " --skip-nonfinite");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 non-finite steps skipped"), std::string::npos) << r.output;
}

// forja inspect plans as the trainer does: the engine keeps fp32 activations in both precisions,
// so the mixed and --fp32 plans differ in the dense weights (embedding) only.
TEST(TrainCli, InspectPlansActivationsAsTheEngineKeepsThem) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const std::string args = "inspect --model " + example().model.string() + " --seq-len 4096 --batch 64";
  const Result mixed = run(args), fp32 = run(args + " --fp32");
  ASSERT_EQ(mixed.exit_code, 0) << mixed.output;
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  const auto line = [](const std::string& out, const std::string& part) {
    const size_t at = out.find("  " + part + " ");
    return at == std::string::npos ? std::string("(none)") : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_EQ(line(mixed.output, "saved activations"), line(fp32.output, "saved activations"));
  EXPECT_NE(line(mixed.output, "saved activations"), "(none)");
  EXPECT_NE(line(mixed.output, "embedding (16-bit)"), "(none)") << mixed.output;
  EXPECT_NE(line(fp32.output, "embedding (32-bit)"), "(none)") << fp32.output;
  EXPECT_NE(mixed.output.find("--precision mixed"), std::string::npos) << mixed.output;
  // with checkpointing, the plan of devices with the fused attention kernels (outputs kept) too
  EXPECT_NE(line(mixed.output, "total, fused attention"), "(none)") << mixed.output;
  EXPECT_EQ(line(fp32.output, "total, fused attention"), "(none)") << fp32.output;
}

// --precision mixed: layer 1's post-attention norm scaled by 2^17 (bf16 0x4800) puts its MLP input
// beyond fp16's range; the step is not finite and the message names the layer, the input and
// the fix (the forward range check, Transformer::fp16_range_report). --skip-nonfinite names it too.
TEST(TrainCli, MixedPrecisionOverflowNamesTheLayer) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path model = changed_model("fp16_overflow_model", [](const std::string& name, std::vector<uint16_t>& v) {
    if (name == "model.layers.1.post_attention_layernorm.weight") v.assign(v.size(), 0x4800);  // 131072
  });
  const std::string args = "train --model " + model.string() + " --data " + example().data.string() +
                           " --precision mixed --seq-len 48 --batch-size 2 --grad-accum 1 --max-steps 1 --out ";
  Result r = run(args + (example().dir / "run_overflow").string());
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("layer 1's MLP input"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--precision fp32"), std::string::npos) << r.output;
  r = run(args + (example().dir / "run_overflow_skip").string() + " --skip-nonfinite");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layer 1's MLP input"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace forja::train
