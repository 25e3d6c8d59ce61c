// Kill anywhere: `forja train` SIGKILLed at seeded random points of a run (inside a step, in the
// middle of a checkpoint, an adapter, the report or a metrics row: src/util/kill_point.h) and
// resumed gives the losses and the adapter of the uninterrupted run, and leaves no half-written
// file or folder behind: every checkpoint there checks against its SHA256SUMS at every moment.
//
// FORJA_KILL_ANYWHERE_POINTS (default 6: each point costs a killed run and its resume, seconds
// on lavapipe) sets how many points, FORJA_KILL_ANYWHERE_SEED (default 19) which ones: the run's
// kill points are cut into that many equal stretches and one point is drawn in each.
// scripts/test runs the 20 in the normal build (about a minute on 2 cores) and the
// default 6 in the ASan build (20 took 3.5 minutes there).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "io/checksums.h"
#include "io/safetensors.h"
#include "support/cli_runner.h"
#include "support/example_run.h"
#include "train/checkpoint.h"

namespace forja::train {
namespace {
namespace fs = std::filesystem;
using forja::test::program;

const forja::test::ExampleFiles& example() {
  static const forja::test::ExampleFiles files = forja::test::make_example_files("kill_anywhere", 5);
  return files;
}

forja::test::ShellResult forja_cmd(const std::string& args, const std::string& env = "") {
  return forja::test::run_shell(env + " " + program() + " " + args + " 2>&1");
}

// Six steps of two micro-batches, a checkpoint every two (the oldest pruned), a metrics row per
// step, the report at each checkpoint, the adapter at the end.
std::string train_args(const fs::path& out) {
  return "train --model " + example().model.string() + " --data " + example().data.string() + " --out " +
         out.string() + " --seq-len 48 --batch-size 2 --grad-accum 2 --max-steps 6 --lr 3e-3 --warmup-steps 1"
         " --save-every 2 --keep-checkpoints 2 --log-every 1 --lora-rank 4";
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// What must hold in OUT at any moment: every checkpoint-N is complete (its checksums agree), an
// adapter in OUT is a whole safetensors file, the resolved config is whole.
void expect_nothing_half_written(const fs::path& out, const std::string& when) {
  for (const fs::path& c : list_checkpoints(out)) {
    const auto damage = io::verify_sha256sums(c);
    EXPECT_FALSE(damage.has_value()) << when << ": " << *damage;
  }
  if (fs::exists(out / "adapter_model.safetensors")) {
    EXPECT_NO_THROW(io::SafetensorsFile::open(out / "adapter_model.safetensors")) << when;
  }
}

// After a resume has finished: nothing of the killed run is left over either.
void expect_no_leftovers(const fs::path& out, const std::string& when) {
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    EXPECT_FALSE(name.ends_with(".partial") || name.ends_with(".old") || name.find(".tmp") != std::string::npos)
        << when << ": " << name << " left in " << out;
  }
  std::ifstream metrics(out / "metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line))
    EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << when << ": metrics row " << line;
}

TEST(KillAnywhere, EveryResumeGivesTheUninterruptedRun) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path dir = example().dir;

  // The uninterrupted run, listing its kill points.
  const fs::path whole = dir / "whole";
  auto r = forja_cmd(train_args(whole), "FORJA_TEST_KILL_AT=list");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> where;
  std::istringstream lines(r.output);
  for (std::string l; std::getline(lines, l);)
    if (l.starts_with("forja: kill point ")) where.push_back(l.substr(l.find(": ", 7) + 2));
  const auto want = forja::test::logged_losses(whole);
  ASSERT_EQ(want.size(), 6u) << r.output;
  const std::string want_adapter = file_bytes(whole / "adapter_model.safetensors");
  const int64_t total = int64_t(where.size());
  ASSERT_GT(total, 40) << r.output;
  for (const char* kind : {"step: a micro-batch", "step: the optimizer", "checkpoint: its partial directory",
                           "checkpoint: renamed into place", "an old checkpoint pruned", "a metrics row half-written",
                           "optimizer.safetensors: half-written", "adapter_model.safetensors: written, before",
                           "report.html: renamed", "SHA256SUMS: half-written"}) {
    bool found = false;
    for (const std::string& w : where) found = found || w.find(kind) != std::string::npos;
    EXPECT_TRUE(found) << "no kill point " << kind << " in\n" << r.output;
  }

  const int64_t count = std::clamp<int64_t>(env_int("FORJA_KILL_ANYWHERE_POINTS", 6), 1, total);
  std::mt19937_64 rng(uint64_t(env_int("FORJA_KILL_ANYWHERE_SEED", 19)));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t lo = 1 + i * total / count, hi = (i + 1) * total / count;
    const int64_t k = std::uniform_int_distribution<int64_t>(lo, std::max(lo, hi))(rng);
    const std::string what = "killed at point " + std::to_string(k) + " of " + std::to_string(total) + " (" +
                             where[size_t(k - 1)] + ")";
    SCOPED_TRACE(what);
    std::printf("%s\n", what.c_str());
    const fs::path out = dir / ("killed_" + std::to_string(k));
    r = forja_cmd(train_args(out), "FORJA_TEST_KILL_AT=" + std::to_string(k));
    ASSERT_EQ(r.exit_code, 128 + 9) << "not killed: " << r.output;
    expect_nothing_half_written(out, what);

    // Resume; a run killed before its first checkpoint starts again.
    if (list_checkpoints(out).empty()) r = forja_cmd(train_args(out) + " --overwrite");
    else r = forja_cmd("train --resume " + out.string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(forja::test::logged_losses(out), want) << r.output;
    EXPECT_TRUE(file_bytes(out / "adapter_model.safetensors") == want_adapter) << "the final adapter differs";
    expect_nothing_half_written(out, what + ", resumed");
    expect_no_leftovers(out, what + ", resumed");
    fs::remove_all(out);
  }
}

}  // namespace
}  // namespace forja::train
