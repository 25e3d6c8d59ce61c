// The tiny example model and chat data that the CLI tests train on (two layers, hidden 64,
// intermediate 128, head_dim 16: seconds per run on lavapipe), made once per test process in a
// temporary folder named after the test file's tag and the pid; and the per-step losses a run
// logged.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "train/example.h"

namespace forja::test {

inline forja::train::ExampleModelShape small_example_shape() {
  forja::train::ExampleModelShape shape;
  shape.hidden = 64;
  shape.intermediate = 128;
  shape.head_dim = 16;
  return shape;
}

struct ExampleFiles {
  std::filesystem::path dir, model, data;
};

// /tmp/forja_<tag>_<pid>/{model, chat.jsonl}, written on the first call of this process; `seed`
// draws the model's weights (the tests' expectations were calibrated with their seeds).
inline ExampleFiles make_example_files(const std::string& tag, uint64_t seed,
                                       forja::train::ExampleModelShape shape = small_example_shape()) {
  ExampleFiles x;
  x.dir = std::filesystem::temp_directory_path() / ("forja_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(x.dir);
  x.model = x.dir / "model";
  x.data = x.dir / "chat.jsonl";
  forja::train::write_example_model(x.model, seed, shape);
  forja::train::write_example_data(x.data);
  return x;
}

// step -> loss of OUT/metrics.jsonl's training rows.
inline std::map<int64_t, double> logged_losses(const std::filesystem::path& out) {
  std::map<int64_t, double> m;
  std::ifstream f(out / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) m[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  }
  return m;
}

}  // namespace forja::test
