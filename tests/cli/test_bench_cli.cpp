// `forja bench` end to end on the CI device: a few training steps of the tiny shape print every
// field (text and --json) with a positive speed and a finite loss; bad input exits 2 with a
// one-line message naming the valid values; `forja bench gemm` still runs as a subcommand.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include "model/precision.h"
#include "support/cli_runner.h"
#include "support/gpu_fixture.h"

namespace forja::cli {
namespace {

using forja::test::program;

// Runs the program with `args`, returning (exit code, stdout) with stderr to `err` (or merged).
std::pair<int, std::string> run(const std::string& args, bool merge_stderr = true) {
  const forja::test::ShellResult r = forja::test::run_shell(program() + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null"));
  return {r.exit_code, r.output};
}

class BenchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(program())) GTEST_SKIP() << program() << " not built";
  }
};

// The memory plan (model/memory_plan.h: what `forja inspect` prints) against what the engine
// really allocated (the arena's peak) in every precision, with and without checkpointing, at
// shapes where different parts dominate: within 3% (issue 18). On the H100 the same plan is
// within 0.1% of the arena at Qwen3-4B 1x2048, 4x512 and 8x2048 (docs/benchmarks.md).
TEST_F(BenchCli, MemoryPlanMatchesTheArenaPeak) {
  for (const char* precision : {"fp32", "mixed"})
    for (const char* ckpt : {"on", "off"})
      for (const char* shape : {"--batch 2 --seq-len 64", "--batch 1 --seq-len 200"}) {
        SCOPED_TRACE(std::string(precision) + " checkpointing " + ckpt + " " + shape);
        auto [rc, out] = run(std::string("bench --shape tiny ") + shape + " --steps 1 --warmup 1 --peak-tflops 1 " +
                                 "--json --precision " + precision + " --grad-checkpointing " + ckpt,
                             false);
        ASSERT_EQ(rc, 0) << out;
        const nlohmann::json j = nlohmann::json::parse(out);
        const double plan = j.at("plan_gib").get<double>(), peak = j.at("peak_gib").get<double>();
        EXPECT_NEAR(plan / peak, 1.0, 0.03) << "plan " << plan << " GiB, arena peak " << peak << " GiB";
      }
}

TEST_F(BenchCli, TinyShapeJsonLine) {
  auto [rc, out] = run("bench --shape tiny --batch 2 --seq-len 24 --steps 2 --warmup 1 --peak-tflops 1 --json",
                       false);
  ASSERT_EQ(rc, 0) << out;
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line: " << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  for (const char* key : {"shape", "batch", "seq", "quant", "precision", "rank", "grad_ckpt", "tokens_per_s",
                          "step_ms", "peak_gib", "mfu", "loss_first", "loss_last", "plan_gib"})
    EXPECT_TRUE(j.contains(key)) << key << " missing in " << out;
  EXPECT_EQ(j.at("shape"), "tiny");
  EXPECT_EQ(j.at("batch"), 2);
  EXPECT_EQ(j.at("seq"), 24);
  EXPECT_EQ(j.at("quant"), "nf4");
  // --precision auto: fp32 on lavapipe, mixed where the device has cooperative matrices
  EXPECT_EQ(j.at("precision"), model::precision_name(model::resolve_precision("auto", test::gpu_context())));
  EXPECT_EQ(j.at("rank"), 16);
  EXPECT_EQ(j.at("grad_ckpt"), true);
  EXPECT_EQ(j.at("host_waits_per_step"), 1) << "a step waits for the GPU once (train/step.h)";
  EXPECT_GT(j.at("tokens_per_s").get<double>(), 0);
  EXPECT_GT(j.at("step_ms").get<double>(), 0);
  EXPECT_GT(j.at("peak_gib").get<double>(), 0);
  EXPECT_GT(j.at("plan_gib").get<double>(), 0);
  EXPECT_GT(j.at("mfu").get<double>(), 0);
  const double first = j.at("loss_first").get<double>(), last = j.at("loss_last").get<double>();
  EXPECT_TRUE(std::isfinite(first) && std::isfinite(last)) << out;
  // random tokens over 512 ids on a near-uniform model: the loss is close to ln(512) = 6.24
  EXPECT_NEAR(first, std::log(512.0), 0.5);
  // tokens/s and ms/step describe the same steps
  EXPECT_NEAR(j.at("tokens_per_s").get<double>() * j.at("step_ms").get<double>() / 1e3, 48.0, 1e-6);
}

TEST_F(BenchCli, TinyShapeTextReportDenseWithoutCheckpointing) {
  auto [rc, out] = run(
      "bench --shape tiny --batch 1 --seq-len 16 --steps 2 --warmup 0 --quant none --grad-checkpointing off "
      "--lora-rank 4");
  ASSERT_EQ(rc, 0) << out;
  for (const char* field : {"tokens/s", "ms/step", "peak GPU memory", "memory plan", "model FLOPs", "MFU",
                            "loss", "4*T*(N_linear + V*H)", "fp32 (not quantised)", "checkpointing off"})
    EXPECT_NE(out.find(field), std::string::npos) << field << " missing in\n" << out;
}

TEST_F(BenchCli, BadInputNamesTheFix) {
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"bench --shape qwen3-14b --batch 1 --seq-len 8", "tiny, qwen3-0.6b, qwen3-4b, qwen3-8b"},
           {"bench --shape tiny --batch 0 --seq-len 8", "--batch 0"},
           {"bench --shape tiny --batch 1 --seq-len 100000", "choose 2..4096"},
           {"bench --shape tiny --batch 1 --seq-len 1", "--seq-len 1"},
           {"bench --shape tiny --batch 1", "--seq-len"},
           {"bench --batch 1 --seq-len 8", "--shape"},
           {"bench --shape tiny --batch 1 --seq-len 8 --quant int8", "nf4"},
           {"bench --shape tiny --batch 1 --seq-len 8 --precision fp16", "fp32"},
       }) {
    auto [rc, out] = run(c.args);
    EXPECT_EQ(rc, 2) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << c.args << "\n" << out;
  }
}

TEST_F(BenchCli, GemmIsStillASubcommand) {
  auto [rc, out] = run("bench gemm --sizes 32x48x40 --reps 1 --iters 1 --only 'scalar f32'");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("32x48x40"), std::string::npos) << out;
  EXPECT_NE(out.find(" ok"), std::string::npos) << out;
  EXPECT_EQ(out.find("tokens/s"), std::string::npos) << "the training bench ran too:\n" << out;
}

}  // namespace
}  // namespace forja::cli
