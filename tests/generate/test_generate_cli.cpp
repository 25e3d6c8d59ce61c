// `forja generate` and `forja eval` end to end on the random cases of make_cases.py: eval's loss
// equals the reference's (dense base, with and without the adapter), --dump-logits writes the
// reference's logits, generation is reproducible, and bad input exits 2 with one line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "generate/generate_cases.h"
#include "io/safetensors.h"
#include "support/cli_runner.h"

namespace forja::test {
namespace {

namespace fs = std::filesystem;

using forja::test::program;

struct Result {
  int rc;
  std::string out, err;
};

// Runs forja with `args`; stdout and stderr apart.
Result run(const std::string& args) {
  const fs::path err_file = fs::temp_directory_path() / ("forja_gen_cli_" + std::to_string(::getpid()) + ".err");
  const std::string cmd = program() + " " + args + " 2>" + err_file.string();
  FILE* f = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int status = ::pclose(f);
  // stderr without the note that the device is a CPU driver (lavapipe in CI)
  std::ifstream e(err_file);
  std::string err;
  for (std::string line; std::getline(e, line);)
    if (line.find("which is the CPU") == std::string::npos) err += line + "\n";
  fs::remove(err_file);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, err};
}

// A user error: exit 2 and one line "forja: ..." naming what is wrong.
void expect_user_error(const Result& r, const std::string& mentions) {
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("forja: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(mentions), std::string::npos) << r.err;
}

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  }
  static fs::path dir(const std::string& name = "qwen3") { return generate_cases_dir() / name; }
};

TEST_F(GenerateCli, EvalLossMatchesReference) {
  const auto ref = read_json(dir() / "eval.json");
  for (bool adapter : {false, true}) {
    const Result r = run("eval --model " + (dir() / "model").string() + " --data " + (dir() / "data.jsonl").string() +
                         " --quant none --seq-len 48 --batch-size 2 --json" +
                         (adapter ? " --adapter " + (dir() / "adapter").string() : ""));
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const double want = ref.at(adapter ? "adapter" : "base").get<double>();
    EXPECT_NEAR(j.at("loss").get<double>(), want, 1e-4 * want);
    EXPECT_NEAR(j.at("perplexity").get<double>(), std::exp(want), 1e-4 * std::exp(want));
    EXPECT_EQ(j.at("loss_tokens").get<int64_t>(), ref.at("loss_tokens").get<int64_t>());
  }
  // NF4 changes the loss a little, not a lot.
  const Result q = run("eval --model " + (dir() / "model").string() + " --data " + (dir() / "data.jsonl").string() +
                       " --seq-len 48 --json");
  ASSERT_EQ(q.rc, 0) << q.err;
  const double base = ref.at("base").get<double>(), nf4 = nlohmann::json::parse(q.out).at("loss").get<double>();
  EXPECT_NE(nf4, base);
  EXPECT_NEAR(nf4, base, 0.05 * base);
}

TEST_F(GenerateCli, DumpLogitsWritesTheFirstExampleLogits) {
  const fs::path out = fs::path(FORJA_BINARY_DIR) / "generate_cli_dump.safetensors";
  const Result r =
      run("eval --model " + (dir() / "model").string() + " --data " + (dir() / "data.jsonl").string() +
          " --quant none --seq-len 48 --adapter " + (dir() / "adapter").string() + " --dump-logits " + out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const io::SafetensorsFile f = io::SafetensorsFile::open(out);
  const std::vector<float> ids = f.tensor("input_ids").to_float();
  const std::vector<float> logits = f.tensor("logits").to_float();
  // The first example of data.jsonl.
  std::ifstream data(dir() / "data.jsonl");
  std::string line;
  std::getline(data, line);
  const auto first = nlohmann::json::parse(line).at("input_ids").get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), first.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], float(first[i]));
  const int64_t V = read_json(dir() / "model" / "config.json").at("vocab_size").get<int64_t>();
  EXPECT_EQ(f.tensor("logits").shape(), (std::vector<int64_t>{int64_t(ids.size()), V}));
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  fs::remove(out);
}

// An adapter written by forja (random-adapter: a subset of targets given out of order, B != 0)
// loads in the reference as PEFT's format says, and forja's logits with it match.
TEST_F(GenerateCli, RandomAdapterMatchesTheReference) {
  const fs::path adapter = fs::path(FORJA_BINARY_DIR) / "generate_cli_random_adapter";
  const fs::path dump = fs::path(FORJA_BINARY_DIR) / "generate_cli_random_adapter.safetensors";
  const std::string model = (dir("qwen2-bias") / "model").string();
  Result r = run("random-adapter --model " + model + " --out " + adapter.string() +
                 " --rank 3 --alpha 6 --targets v_proj,q_proj,down_proj --seed 4");
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run("eval --model " + model + " --adapter " + adapter.string() + " --data " +
          (dir("qwen2-bias") / "data.jsonl").string() + " --quant none --seq-len 48 --dump-logits " + dump.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string cmd = "/usr/bin/python3 " + std::string(FORJA_SOURCE_DIR) + "/tests/generate/reference_logits.py " +
                          model + " " + adapter.string() + " " + dump.string();
  FILE* f = ::popen(cmd.c_str(), "r");
  double rel = 1, effect = 0;
  ASSERT_EQ(std::fscanf(f, "rel %lf effect %lf", &rel, &effect), 2);
  ::pclose(f);
  EXPECT_LT(rel, 1e-4);
  EXPECT_GT(effect, 1e-3);  // the adapter really changes the logits
  fs::remove_all(adapter);
  fs::remove(dump);
}

TEST_F(GenerateCli, GenerationIsReproducible) {
  const std::string base = "generate --model " + (dir() / "model").string() + " --adapter " +
                           (dir() / "adapter").string() + " --prompt 'hello world' --max-new-tokens 10";
  const Result g1 = run(base), g2 = run(base + " --temperature 0");
  ASSERT_EQ(g1.rc, 0) << g1.err;
  EXPECT_EQ(g1.out, g2.out);
  EXPECT_NE(g1.err.find("greedy"), std::string::npos) << g1.err;
  const Result s1 = run(base + " --temperature 1.3 --top-k 50 --seed 11"),
               s2 = run(base + " --temperature 1.3 --top-k 50 --seed 11");
  ASSERT_EQ(s1.rc, 0) << s1.err;
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_FALSE(s1.out.empty());
  // The raw prompt (no template) is a different input.
  const Result raw = run(base + " --no-chat-template --quant none");
  ASSERT_EQ(raw.rc, 0) << raw.err;
  EXPECT_NE(raw.err.find("tokens after a 2-token prompt"), std::string::npos) << raw.err;
}

TEST_F(GenerateCli, ChatKeepsHistory) {
  const std::string cmd = "generate --model " + (dir() / "model").string() +
                          " --chat --max-new-tokens 4 --quant none --max-context 128 < /dev/null";
  const Result empty = run(cmd);
  EXPECT_EQ(empty.rc, 0) << empty.err;
  const fs::path in = fs::path(FORJA_BINARY_DIR) / "generate_cli_chat.txt";
  std::ofstream(in) << "hello\n\n/reset\nhello world\nand again\n";
  const Result r = run("generate --model " + (dir() / "model").string() +
                       " --chat --max-new-tokens 4 --quant none --max-context 128 < " + in.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  // three answers; the third turn re-used the cached conversation (its prompt is only the new part)
  size_t answers = 0, pos = 0;
  while ((pos = r.err.find("tokens after a", pos)) != std::string::npos) ++answers, ++pos;
  EXPECT_EQ(answers, 3u) << r.err;
  EXPECT_NE(r.err.find("conversation cleared"), std::string::npos);
  fs::remove(in);
}

TEST_F(GenerateCli, UserErrorsExit2WithOneLine) {
  const std::string model = (dir() / "model").string();
  expect_user_error(run("generate --model /nonexistent/model --prompt hi"), "/nonexistent/model");
  expect_user_error(run("generate --model " + model + " --prompt hi --chat"), "not both");
  expect_user_error(run("generate --model " + model), "--prompt");
  expect_user_error(run("generate --model " + model + " --prompt hi --quant int8"), "--quant");
  expect_user_error(run("generate --model " + model + " --prompt hi --top-p 0"), "--top-p");
  expect_user_error(run("generate --model " + model + " --prompt hi --adapter /nonexistent/adapter"),
                    "/nonexistent/adapter");
  // an adapter made for another model (other shapes)
  expect_user_error(
      run("generate --model " + model + " --prompt hi --adapter " + (dir("llama-rope") / "adapter").string()),
      "adapter");
  expect_user_error(run("eval --model " + model + " --data /nonexistent/data.jsonl"), "/nonexistent/data.jsonl");
  expect_user_error(run("eval --model " + model + " --data " + (dir() / "data.jsonl").string() + " --batch-size 0"),
                    "--batch-size");
}

}  // namespace
}  // namespace forja::test
