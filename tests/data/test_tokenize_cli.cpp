// `forja tokenize` end to end: --text prints the ids as JSON (`[]` for an empty text), --decode prints the text, --data
// summarises a dataset and --out writes ids and labels; bad input exits 2 with a one-line message.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/cli_runner.h"
#include "tokenizer_fixtures.h"

namespace forja::data {
namespace {

using forja::test::program;

// Runs the command, returning (exit code, stdout + stderr).
std::pair<int, std::string> run(const std::string& args) {
  const forja::test::ShellResult r = forja::test::run_shell(program() + " " + args + " 2>&1");
  return {r.exit_code, r.output};
}

TEST(TokenizerCli, TextDecodeAndDataSummary) {
  if (!std::filesystem::exists(program())) GTEST_SKIP() << program() << " not built";
  const std::string model = test::model_dir("qwen3").string();
  const Tokenizer& tok = test::real_tokenizer("qwen3");
  auto [rc, out] = run("tokenize --model " + model + " --text 'Hi <|im_end|> 42'");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out).get<std::vector<int32_t>>(), tok.encode("Hi <|im_end|> 42"));
  // an empty text is a text: no ids, not a missing option
  std::tie(rc, out) = run("tokenize --model " + model + " --text ''");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "[]\n");
  std::tie(rc, out) = run("tokenize --model " + model + " --decode 13048,151645");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, tok.decode(std::vector<int32_t>{13048, 151645}) + "\n");

  const auto dir = std::filesystem::temp_directory_path() / "forja_tokenize_cli_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "d.jsonl") << R"({"prompt": "Q", "completion": " A"})" "\n"
                                 << R"({"text": "plain text"})" "\n";
  std::tie(rc, out) = run("tokenize --model " + model + " --data " + (dir / "d.jsonl").string() +
                          " --out " + (dir / "o.jsonl").string() + " --seq-len 32");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("2 examples"), std::string::npos) << out;
  std::ifstream o(dir / "o.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(o, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("input_ids").size(), j.at("labels").size());
    ++n;
  }
  EXPECT_EQ(n, 2);

  std::ofstream(dir / "bad.jsonl") << R"({"text": "ok"})" "\n" << "{oops\n";
  std::tie(rc, out) = run("tokenize --model " + model + " --data " + (dir / "bad.jsonl").string());
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("bad.jsonl:2"), std::string::npos) << out;
  std::tie(rc, out) = run("tokenize --model " + model + " --decode 1,x");
  EXPECT_EQ(rc, 2) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace forja::data
