// PEFT adapter files: adapter_config.json (sorted keys, PEFT's field names) and
// adapter_model.safetensors (lora_A / lora_B per projection, no adapter name in the keys).
#include "io/adapter.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace forja::io {
namespace {

using json = nlohmann::json;

constexpr const char* kPrefix = "base_model.model.model.layers.";

}  // namespace

double LoraConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r))
                    : lora_alpha / static_cast<double>(r);
}

const LoraTarget* LoraTargetShapes::find(const std::string& name) const {
  for (const LoraTarget& t : targets)
    if (t.name == name) return &t;
  return nullptr;
}

std::string lora_tensor_name(std::int64_t layer, const std::string& module_path, char a_or_b) {
  return kPrefix + std::to_string(layer) + "." + module_path + ".lora_" + std::string(1, a_or_b) +
         ".weight";
}

std::string adapter_config_json(const LoraConfig& c) {
  json j;  // nlohmann's object is a std::map: keys come out sorted, as PEFT's sort_keys=True
  j["alpha_pattern"] = json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] =
      c.base_model_name_or_path.empty() ? json(nullptr) : json(c.base_model_name_or_path);
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = c.inference_mode;
  j["init_lora_weights"] = true;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  // PEFT writes integral alphas as JSON integers.
  if (c.lora_alpha == std::floor(c.lora_alpha) && std::fabs(c.lora_alpha) < 1e15)
    j["lora_alpha"] = static_cast<std::int64_t>(c.lora_alpha);
  else
    j["lora_alpha"] = c.lora_alpha;
  j["lora_dropout"] = c.lora_dropout;
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = c.r;
  j["rank_pattern"] = json::object();
  j["revision"] = c.revision.empty() ? json(nullptr) : json(c.revision);
  std::vector<std::string> targets = c.target_modules;
  std::sort(targets.begin(), targets.end());  // PEFT stores a set, serialised as a list
  j["target_modules"] = targets;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = c.use_rslora;
  return j.dump(2) + "\n";
}

LoraConfig parse_adapter_config(const std::string& text, const std::string& source) {
  const json j = parse_json_strict(text, source);
  auto fail = [&](const std::string& problem) -> void { throw UserError(source + ": " + problem); };
  if (!j.is_object()) fail("adapter_config.json must be a JSON object");
  auto get = [&](const char* key) -> const json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  const json* peft_type = get("peft_type");
  if (!peft_type || !peft_type->is_string() || peft_type->get<std::string>() != "LORA")
    fail("\"peft_type\" must be \"LORA\"; forja reads LoRA adapters only");

  LoraConfig c;
  if (const json* v = get("base_model_name_or_path"); v && v->is_string())
    c.base_model_name_or_path = v->get<std::string>();
  if (const json* v = get("revision"); v && v->is_string()) c.revision = v->get<std::string>();
  if (const json* v = get("r")) {
    if (!v->is_number_integer() || v->get<std::int64_t>() <= 0)
      fail("\"r\" must be a positive integer, got " + v->dump());
    c.r = v->get<std::int64_t>();
  }
  if (const json* v = get("lora_alpha")) {
    if (!v->is_number()) fail("\"lora_alpha\" must be a number, got " + v->dump());
    c.lora_alpha = v->get<double>();
  }
  if (const json* v = get("lora_dropout")) {
    if (!v->is_number()) fail("\"lora_dropout\" must be a number, got " + v->dump());
    c.lora_dropout = v->get<double>();
  }
  if (const json* v = get("use_rslora")) c.use_rslora = v->is_boolean() && v->get<bool>();
  if (const json* v = get("inference_mode")) c.inference_mode = v->is_boolean() && v->get<bool>();

  const json* targets = get("target_modules");
  if (!targets)
    fail(
        "\"target_modules\" is missing; list the adapted projections, e.g. [\"q_proj\", "
        "\"v_proj\"]");
  if (targets->is_string()) {
    if (targets->get<std::string>() != "all-linear")
      fail("\"target_modules\" is the regular expression " + targets->dump() +
           ", which forja does not evaluate; write the list of projection names instead");
    c.target_modules = {"all-linear"};
  } else if (targets->is_array()) {
    for (const json& t : *targets) {
      if (!t.is_string()) fail("\"target_modules\" entries must be strings, got " + t.dump());
      c.target_modules.push_back(t.get<std::string>());
    }
  } else {
    fail("\"target_modules\" must be a list of names or \"all-linear\"");
  }

  // Features whose weights or math forja would get wrong: refuse rather than silently differ.
  auto truthy = [&](const char* key) {
    const json* v = get(key);
    if (!v) return false;
    if (v->is_boolean()) return v->get<bool>();
    if (v->is_object() || v->is_array() || v->is_string()) return !v->empty();
    return true;
  };
  if (truthy("use_dora"))
    fail("DoRA adapters (\"use_dora\": true) are not supported; use a plain LoRA adapter");
  if (truthy("fan_in_fan_out"))
    fail(
        "\"fan_in_fan_out\": true is for GPT-2-style Conv1D weights, which these models do not "
        "have");
  if (const json* v = get("bias"); v && (!v->is_string() || v->get<std::string>() != "none"))
    fail("\"bias\" is " + v->dump() + "; forja supports only \"none\" (no trained biases)");
  if (truthy("rank_pattern") || truthy("alpha_pattern"))
    fail(
        "per-module \"rank_pattern\"/\"alpha_pattern\" are not supported; use one r and lora_alpha "
        "for all projections");
  if (truthy("modules_to_save"))
    fail(
        "\"modules_to_save\" (fully trained extra modules) is not supported; only LoRA factors are "
        "loaded");
  if (truthy("layers_to_transform"))
    fail(
        "\"layers_to_transform\" (LoRA on some layers only) is not supported; the adapter must "
        "cover every layer");
  return c;
}

std::vector<const LoraTarget*> resolve_targets(const LoraConfig& config,
                                               const LoraTargetShapes& shapes,
                                               const std::string& source) {
  std::vector<const LoraTarget*> out;
  std::set<const LoraTarget*> seen;
  for (const std::string& entry : config.target_modules) {
    std::vector<const LoraTarget*> matched;
    for (const LoraTarget& t : shapes.targets) {
      // PEFT matches a module when its full name equals the entry or ends with "." + entry.
      const std::string full = "." + t.module_path;
      if (entry == "all-linear" || t.name == entry || t.module_path == entry ||
          (full.size() > entry.size() + 1 && full.ends_with("." + entry)))
        matched.push_back(&t);
    }
    if (matched.empty()) {
      std::string names;
      for (const LoraTarget& t : shapes.targets) names += (names.empty() ? "" : ", ") + t.name;
      throw UserError(source + ": target module \"" + entry +
                      "\" is not a projection forja can adapt (" + names + ")");
    }
    for (const LoraTarget* t : matched)
      if (seen.insert(t).second) out.push_back(t);
  }
  // Keep the model's order (q, k, v, o, gate, up, down), whatever the list order: the pointers
  // point into shapes.targets, so address order is that order.
  std::sort(out.begin(), out.end(), std::less<const LoraTarget*>());
  return out;
}

void save_adapter(const std::filesystem::path& dir, const Adapter& adapter,
                  const LoraTargetShapes& shapes) {
  const std::int64_t r = adapter.config.r;
  std::vector<TensorToWrite> tensors;
  std::set<std::string> names;
  for (const LoraWeights& w : adapter.weights) {
    const LoraTarget* t = shapes.find(w.target);
    if (!t) throw UserError("save_adapter: unknown projection '" + w.target + "'");
    if (w.layer < 0 || w.layer >= shapes.num_layers)
      throw UserError("save_adapter: layer " + std::to_string(w.layer) + " out of range");
    if (static_cast<std::int64_t>(w.a.size()) != r * t->in_features ||
        static_cast<std::int64_t>(w.b.size()) != t->out_features * r)
      throw UserError("save_adapter: layer " + std::to_string(w.layer) + " " + w.target +
                      " factors do not have shapes A " + shape_text({r, t->in_features}) + " and B " +
                      shape_text({t->out_features, r}));
    const std::string a_name = lora_tensor_name(w.layer, t->module_path, 'A');
    if (!names.insert(a_name).second) throw UserError("save_adapter: " + a_name + " given twice");
    tensors.push_back({a_name, Dtype::F32, {r, t->in_features}, std::as_bytes(std::span(w.a)), {}});
    tensors.push_back({lora_tensor_name(w.layer, t->module_path, 'B'),
                       Dtype::F32,
                       {t->out_features, r},
                       std::as_bytes(std::span(w.b)),
                       {}});
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw UserError(dir.string() + ": cannot create the adapter directory (" + ec.message() + ")");
  write_safetensors(dir / "adapter_model.safetensors", std::move(tensors));
  write_file_atomic(dir / "adapter_config.json", adapter_config_json(adapter.config));
}

AdapterFile::AdapterFile(LoraConfig config, std::vector<LoraTarget> targets,
                         std::int64_t num_layers, SafetensorsFile file)
    : config_(std::move(config)),
      targets_(std::move(targets)),
      num_layers_(num_layers),
      file_(std::move(file)) {}

AdapterFile AdapterFile::open(const std::filesystem::path& dir, const LoraTargetShapes& shapes) {
  const std::filesystem::path config_path = dir / "adapter_config.json";
  const std::filesystem::path weights_path = dir / "adapter_model.safetensors";
  std::error_code ec;
  if (!std::filesystem::exists(config_path, ec))
    throw UserError(config_path.string() +
                    ": not found; an adapter directory holds adapter_config.json and "
                    "adapter_model.safetensors (adapters saved as .bin must be converted first)");
  LoraConfig config = parse_adapter_config(read_text_file(config_path), config_path.string());
  const std::int64_t r = config.r;
  std::vector<LoraTarget> targets;
  for (const LoraTarget* t : resolve_targets(config, shapes, config_path.string()))
    targets.push_back(*t);

  SafetensorsFile file = SafetensorsFile::open(weights_path);
  const std::string where = weights_path.string() + ": ";
  std::set<std::string> expected;
  for (std::int64_t layer = 0; layer < shapes.num_layers; ++layer) {
    for (const LoraTarget& t : targets) {
      for (char which : {'A', 'B'}) {
        const std::string name = lora_tensor_name(layer, t.module_path, which);
        expected.insert(name);
        const TensorInfo* info = file.find(name);
        if (!info)
          throw UserError(where + "missing tensor '" + name + "'; adapter_config.json targets " +
                          t.name +
                          " in every layer: the adapter is incomplete or for another model");
        const std::vector<std::int64_t> want = which == 'A'
                                                   ? std::vector<std::int64_t>{r, t.in_features}
                                                   : std::vector<std::int64_t>{t.out_features, r};
        if (info->shape != want) {
          throw UserError(where + "tensor '" + name + "' has shape " + shape_text(info->shape) +
                          " but r = " + std::to_string(r) + " and the model need " + shape_text(want) +
                          "; the adapter was trained for a different model or rank");
        }
      }
    }
  }
  for (const TensorInfo& t : file.tensors())
    if (!expected.count(t.name))
      throw UserError(where + "unexpected tensor '" + t.name +
                      "' (not a lora_A/lora_B of a targeted projection "
                      "in layers 0.." +
                      std::to_string(shapes.num_layers - 1) +
                      "); the adapter does not match the model or adapter_config.json");
  return AdapterFile(std::move(config), std::move(targets), shapes.num_layers, std::move(file));
}

TensorView AdapterFile::factor(std::int64_t layer, const LoraTarget& target, char a_or_b) const {
  return file_.tensor(lora_tensor_name(layer, target.module_path, a_or_b));
}

Adapter load_adapter(const std::filesystem::path& dir, const LoraTargetShapes& shapes) {
  const AdapterFile file = AdapterFile::open(dir, shapes);
  Adapter adapter;
  adapter.config = file.config();
  for (std::int64_t layer = 0; layer < file.num_layers(); ++layer) {
    for (const LoraTarget& t : file.targets()) {
      LoraWeights w;
      w.layer = layer;
      w.target = t.name;
      w.a = file.factor(layer, t, 'A').to_float();
      w.b = file.factor(layer, t, 'B').to_float();
      adapter.weights.push_back(std::move(w));
    }
  }
  return adapter;
}

}  // namespace forja::io
