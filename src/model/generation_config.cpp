#include "model/generation_config.h"

#include <nlohmann/json.hpp>

#include "io/json_file.h"
#include "util/error.h"

namespace forja::model {

GenerationConfig load_generation_config(const std::filesystem::path& model_dir) {
  GenerationConfig g;
  const std::filesystem::path path = model_dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return g;
  g.path = path.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_text_file(path));
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number too large
    throw UserError(path.string() + ": not valid JSON (" + e.what() + "); fix or delete the file");
  }
  auto bad = [&](const char* key, const char* want) {
    return UserError(path.string() + ": \"" + key + "\" must be " + want + "; fix or delete the file");
  };
  if (!j.is_object()) throw UserError(path.string() + ": expected a JSON object; fix or delete the file");
  if (j.contains("do_sample") && !j["do_sample"].is_null()) {
    if (!j["do_sample"].is_boolean()) throw bad("do_sample", "true or false");
    g.do_sample = j["do_sample"].get<bool>();
  }
  auto number = [&](const char* key, std::optional<double>& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) throw bad(key, "a number");
    out = j[key].get<double>();
  };
  // The ranges the sampler takes (model/sampler.h), checked here so that the error names the file.
  number("temperature", g.temperature);
  if (g.temperature && !(*g.temperature >= 0)) throw bad("temperature", "0 (greedy) or positive");
  number("top_p", g.top_p);
  if (g.top_p && !(*g.top_p > 0 && *g.top_p <= 1)) throw bad("top_p", "in (0, 1]");
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!j["top_k"].is_number_integer()) throw bad("top_k", "an integer");
    g.top_k = j["top_k"].get<int64_t>();
    if (*g.top_k < 0) throw bad("top_k", "0 (off) or positive");
  }
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      g.eos_token_ids.push_back(e.get<int64_t>());
    } else if (e.is_array()) {
      for (const auto& x : e) {
        if (!x.is_number_integer()) throw bad("eos_token_id", "an integer or a list of integers");
        g.eos_token_ids.push_back(x.get<int64_t>());
      }
    } else {
      throw bad("eos_token_id", "an integer or a list of integers");
    }
  }
  return g;
}

}  // namespace forja::model
