// What `forja train` does when the GPU fails: out of memory (exit 4), device lost (exit 5), no
// usable Vulkan driver (exit 6); each with one message naming the fix and what of the run is
// safe, and the last checkpoint resumable to the losses of an uninterrupted run. lavapipe cannot
// be made to run out of memory or lose the device, so the first two come through test hooks that
// fail the Vulkan call as a driver does (FORJA_TEST_GPU_MEMORY_MIB in gpu/memory.cpp,
// FORJA_TEST_DEVICE_LOST_AFTER_STEP in train/trainer.cpp); the third is real (no driver at all).
#include <gtest/gtest.h>

#include <string>

#include "io/checksums.h"
#include "support/cli_runner.h"
#include "support/example_run.h"
#include "train/checkpoint.h"

namespace forja::train {
namespace {
namespace fs = std::filesystem;
using forja::test::program;

const forja::test::ExampleFiles& example() {
  static const forja::test::ExampleFiles files = forja::test::make_example_files("gpu_failures", 2);
  return files;
}

forja::test::ShellResult forja_cmd(const std::string& args, const std::string& env = "") {
  return forja::test::run_shell(env + " " + program() + " " + args + " 2>&1");
}

std::string train_args(const fs::path& out) {
  return "train --model " + example().model.string() + " --data " + example().data.string() + " --out " +
         out.string() + " --seq-len 48 --batch-size 2 --grad-accum 1 --max-steps 5 --lr 3e-3 --warmup-steps 1"
         " --save-every 2 --keep-checkpoints 0 --log-every 1 --lora-rank 4";
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(GpuFailures, OutOfMemoryAndDeviceLostNameTheFixAndKeepTheLastCheckpoint) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path dir = example().dir;

  const fs::path whole = dir / "whole";
  auto r = forja_cmd(train_args(whole));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = forja::test::logged_losses(whole);

  // Out of memory before the first step: exit 4, what to lower, nothing to resume yet.
  const fs::path oom = dir / "oom";
  r = forja_cmd(train_args(oom), "FORJA_TEST_GPU_MEMORY_MIB=1");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(has(r.output, "forja: GPU out of memory")) << r.output;
  EXPECT_TRUE(has(r.output, "--batch-size") && has(r.output, "--seq-len") && has(r.output, "--grad-checkpointing on"))
      << r.output;
  EXPECT_TRUE(has(r.output, "No checkpoint had been written yet")) << r.output;
  EXPECT_FALSE(has(r.output, "internal error")) << r.output;

  // The device lost after step 3: exit 5, checkpoint-2 named and intact.
  const fs::path lost = dir / "lost";
  r = forja_cmd(train_args(lost), "FORJA_TEST_DEVICE_LOST_AFTER_STEP=3");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_TRUE(has(r.output, "VK_ERROR_DEVICE_LOST") && has(r.output, "the GPU was lost")) << r.output;
  EXPECT_TRUE(has(r.output, (lost / "checkpoint-2").string() + ", is intact")) << r.output;
  EXPECT_TRUE(has(r.output, "forja train --resume " + lost.string())) << r.output;
  EXPECT_FALSE(has(r.output, "internal error")) << r.output;
  ASSERT_EQ(list_checkpoints(lost), std::vector<fs::path>{lost / "checkpoint-2"});
  EXPECT_FALSE(io::verify_sha256sums(lost / "checkpoint-2").has_value());

  // Out of memory on the resume: exit 4 again, the checkpoint still named and intact.
  r = forja_cmd("train --resume " + lost.string(), "FORJA_TEST_GPU_MEMORY_MIB=1");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(has(r.output, (lost / "checkpoint-2").string() + ", is intact")) << r.output;
  EXPECT_FALSE(io::verify_sha256sums(lost / "checkpoint-2").has_value());

  // With the memory back, the resume gives the uninterrupted run's losses.
  r = forja_cmd("train --resume " + lost.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(forja::test::logged_losses(lost), want) << r.output;
}

TEST(GpuFailures, NoVulkanDriverExitsSix) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  // The loader finds no driver manifest: vkCreateInstance fails as on a machine without one.
  const std::string no_driver = "VK_ICD_FILENAMES=/nonexistent/icd.json VK_DRIVER_FILES=/nonexistent/icd.json";
  auto r = forja_cmd("devices", no_driver);
  EXPECT_EQ(r.exit_code, 6) << r.output;
  EXPECT_TRUE(has(r.output, "no Vulkan driver found") || has(r.output, "found no device")) << r.output;
  EXPECT_TRUE(has(r.output, "mesa-vulkan-drivers")) << r.output;
  r = forja_cmd(train_args(example().dir / "no_driver"), no_driver);
  EXPECT_EQ(r.exit_code, 6) << r.output;
}

}  // namespace
}  // namespace forja::train
