// Pre-tokenized data without a tokenizer: `forja train` and `forja eval` on {"input_ids"[,
// "labels"]} JSONL with a model directory that holds no tokenizer.json; ids at or above the
// config's vocab_size are a file:line error; text data and `forja generate` name the missing file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "support/cli_runner.h"
#include "train/example.h"

namespace forja::train {
namespace {
namespace fs = std::filesystem;

using forja::test::program;

forja::test::ShellResult run(const std::string& args) {
  return forja::test::run_shell(program() + " " + args + " 2>&1");
}

// The example model without tokenizer files, its vocabulary size, and an ids-only dataset.
struct IdsSetup {
  fs::path dir, model, data;
  int64_t vocab = 0;
};
const IdsSetup& setup() {
  static const IdsSetup s = [] {
    IdsSetup x;
    x.dir = fs::temp_directory_path() / ("forja_train_ids_" + std::to_string(::getpid()));
    fs::remove_all(x.dir);
    x.model = x.dir / "model";
    ExampleModelShape shape;
    shape.hidden = 64;
    shape.intermediate = 128;
    shape.head_dim = 16;
    write_example_model(x.model, 5, shape);
    fs::remove(x.model / "tokenizer.json");
    fs::remove(x.model / "tokenizer_config.json");
    x.vocab = nlohmann::json::parse(std::ifstream(x.model / "config.json")).at("vocab_size").get<int64_t>();
    // 8 examples of 12..30 ids; every other one with labels that mask its first half.
    x.data = x.dir / "ids.jsonl";
    std::ofstream f(x.data);
    std::mt19937 rng(7);
    for (int i = 0; i < 8; ++i) {
      std::vector<int64_t> ids(size_t(12 + 6 * (i % 4)));
      for (auto& id : ids) id = int64_t(rng() % uint32_t(x.vocab));
      nlohmann::json row = {{"input_ids", ids}};
      if (i % 2) {
        std::vector<int64_t> labels = ids;
        for (size_t k = 0; k < labels.size() / 2; ++k) labels[k] = -100;
        row["labels"] = labels;
      }
      f << row.dump() << "\n";
    }
    return x;
  }();
  return s;
}

TEST(TrainIdsCli, TrainsAndEvaluatesTokenIdsWithoutATokenizer) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const IdsSetup& s = setup();
  ASSERT_FALSE(fs::exists(s.model / "tokenizer.json"));
  const fs::path out = s.dir / "run";
  auto r = run("train --model " + s.model.string() + " --data " + s.data.string() + " --out " + out.string() +
               " --seq-len 32 --batch-size 2 --grad-accum 1 --max-steps 2 --log-every 1 --save-every 0 --lora-rank 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int losses = 0;
  std::ifstream metrics(out / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) {
      EXPECT_TRUE(std::isfinite(j.at("loss").get<double>())) << line;
      ++losses;
    }
  }
  EXPECT_EQ(losses, 2) << r.output;
  EXPECT_TRUE(fs::exists(out / "adapter_model.safetensors")) << r.output;

  r = run("eval --model " + s.model.string() + " --adapter " + out.string() + " --data " + s.data.string() +
          " --seq-len 32 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.rfind('{')));
  EXPECT_TRUE(std::isfinite(j.at("loss").get<double>())) << r.output;
  EXPECT_EQ(j.at("examples").get<int64_t>(), 8) << r.output;
}

TEST(TrainIdsCli, OutOfRangeIdsTextDataAndGenerateNameTheProblem) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const IdsSetup& s = setup();
  auto expect_error = [&](const std::string& args, const std::vector<std::string>& needles) {
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    for (const auto& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << n << "\n" << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  };
  // line 3 holds vocab_size itself, one past the last id
  const fs::path bad = s.dir / "bad_ids.jsonl";
  std::ofstream(bad) << R"({"input_ids": [1, 2, 3]})" "\n"
                     << R"({"input_ids": [4, 5, 6]})" "\n"
                     << R"({"input_ids": [7, )" << s.vocab << R"(, 8]})" "\n";
  const std::string where = bad.string() + ":3";
  const std::string range = "outside the vocabulary (0.." + std::to_string(s.vocab - 1) + ")";
  expect_error("train --model " + s.model.string() + " --data " + bad.string() + " --out " +
                   (s.dir / "run_bad").string() + " --seq-len 32 --max-steps 1",
               {where, range});
  expect_error("eval --model " + s.model.string() + " --data " + bad.string() + " --seq-len 32", {where, range});

  // text needs the tokenizer: the error names the file that is missing and both ways out
  const fs::path text = s.dir / "text.jsonl";
  std::ofstream(text) << R"({"input_ids": [1, 2, 3]})" "\n" << R"({"text": "hello"})" "\n";
  const std::string tok = (s.model / "tokenizer.json").string();
  expect_error("train --model " + s.model.string() + " --data " + text.string() + " --out " +
                   (s.dir / "run_text").string() + " --seq-len 32 --max-steps 1",
               {text.string() + ":2", tok + " is missing", "input_ids"});
  expect_error("generate --model " + s.model.string() + " --prompt hi", {tok + ": not found", "tokenizer"});
}

}  // namespace
}  // namespace forja::train
