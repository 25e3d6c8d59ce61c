// The cases of tests/generate/make_cases.py (random models with a tiny tokenizer, a random
// adapter, reference logits and eval losses), made once per build directory under a file lock.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

#include "train/parity_support.h"

namespace forja::test {

inline const std::filesystem::path& generate_cases_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = std::filesystem::path(FORJA_BINARY_DIR) / "generate_cases";
    run_once("rm -rf " + d.string() + " && /usr/bin/python3 " + std::string(FORJA_SOURCE_DIR) +
                 "/tests/generate/make_cases.py --out " + d.string() + " > " + d.string() + ".log 2>&1",
             std::filesystem::path(FORJA_BINARY_DIR) / "generate_cases.done");
    return d;
  }();
  return dir;
}

}  // namespace forja::test
