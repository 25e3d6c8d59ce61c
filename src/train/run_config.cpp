#include "train/run_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "data/utf8.h"
#include "util/error.h"
#include "util/nearest.h"

namespace forja::train {
namespace fs = std::filesystem;

namespace {

int64_t parse_int(const std::string& v, const std::string& src) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE)
    throw UserError(src + ": '" + v + "' is not a whole number");
  return x;
}

double parse_double(const std::string& v, const std::string& src) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x)) throw UserError(src + ": '" + v + "' is not a number");
  return x;
}

bool parse_bool(const std::string& v, const std::string& src) {
  if (v.empty() || v == "on" || v == "true" || v == "yes" || v == "1") return true;
  if (v == "off" || v == "false" || v == "no" || v == "0") return false;
  throw UserError(src + ": '" + v + "' is not on/off (true/false)");
}

Toggle parse_toggle(const std::string& v, const std::string& src) {
  if (v == "auto") return Toggle::automatic;
  return parse_bool(v, src) ? Toggle::on : Toggle::off;
}

std::string toggle_name(Toggle t) { return t == Toggle::automatic ? "auto" : t == Toggle::on ? "on" : "off"; }

// The words of a setting that takes one of a few values, in the order errors list them.
template <class T>
using Words = std::vector<std::pair<const char*, T>>;

const Words<Schedule>& schedule_words() {
  static const Words<Schedule> w = [] {
    Words<Schedule> out;
    for (Schedule x : {Schedule::constant, Schedule::linear, Schedule::cosine}) out.emplace_back(schedule_name(x), x);
    return out;
  }();
  return w;
}
const Words<model::BaseQuant>& quant_words() {
  static const Words<model::BaseQuant> w = {{"nf4", model::BaseQuant::nf4}, {"none", model::BaseQuant::none}};
  return w;
}
const Words<model::PrecisionChoice>& precision_words() {
  static const Words<model::PrecisionChoice> w = {{"auto", std::nullopt},
                                                  {model::precision_name(model::Precision::fp32), model::Precision::fp32},
                                                  {model::precision_name(model::Precision::mixed), model::Precision::mixed}};
  return w;
}

template <class T>
T parse_word(const std::string& v, const std::string& src, const Words<T>& words) {
  for (const auto& [word, value] : words)
    if (v == word) return value;
  std::string list;
  for (const auto& [word, value] : words) list += (list.empty() ? "" : ", ") + std::string(word);
  throw UserError(src + ": '" + v + "' is not one of " + list);
}

template <class T>
std::string word_of(const T& x, const Words<T>& words) {
  for (const auto& [word, value] : words)
    if (value == x) return word;
  throw std::logic_error("RunConfig: a value without a word");
}

std::string format_double(double x) {
  std::ostringstream s;
  s.precision(10);
  s << x;
  return s.str();
}

// "q,k,v" or "q_proj,k_proj" or "all" -> projection names
std::vector<std::string> parse_targets(const std::string& v, const std::string& src) {
  static const std::vector<std::string> all = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  if (v == "all" || v == "all-linear") return all;
  std::vector<std::string> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty()) continue;
    std::string name = item.size() > 5 && item.ends_with("_proj") ? item : item + "_proj";
    if (std::find(all.begin(), all.end(), name) == all.end())
      throw UserError(src + ": unknown LoRA target '" + item + "'; choose from q,k,v,o,gate,up,down (or all)");
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  if (out.empty()) throw UserError(src + ": no LoRA target given; e.g. --lora-targets q,k,v,o,gate,up,down");
  return out;
}

struct KeyImpl {
  ConfigKey meta;
  std::function<void(RunConfig&, const std::string&, const std::string&)> set;
  std::function<std::string(const RunConfig&)> get;
};

#define PATH_KEY(NAME, FIELD, HELP)                                                                     \
  KeyImpl{{NAME, "PATH", HELP},                                                                        \
          [](RunConfig& c, const std::string& v, const std::string&) { c.FIELD = v; },                 \
          [](const RunConfig& c) { return c.FIELD.empty() ? std::string() : fs::absolute(c.FIELD).string(); }}
#define INT_KEY(NAME, FIELD, HELP)                                                                      \
  KeyImpl{{NAME, "N", HELP}, [](RunConfig& c, const std::string& v, const std::string& s) { c.FIELD = parse_int(v, s); }, \
          [](const RunConfig& c) { return std::to_string(c.FIELD); }}
#define DOUBLE_KEY(NAME, FIELD, HELP)                                                                   \
  KeyImpl{{NAME, "X", HELP}, [](RunConfig& c, const std::string& v, const std::string& s) { c.FIELD = parse_double(v, s); }, \
          [](const RunConfig& c) { return format_double(c.FIELD); }}
#define BOOL_KEY(NAME, FIELD, HELP)                                                                     \
  KeyImpl{{NAME, "", HELP}, [](RunConfig& c, const std::string& v, const std::string& s) { c.FIELD = parse_bool(v, s); }, \
          [](const RunConfig& c) { return std::string(c.FIELD ? "true" : "false"); }}
#define TOGGLE_KEY(NAME, FIELD, HELP)                                                                   \
  KeyImpl{{NAME, "{auto,on,off}", HELP},                                                               \
          [](RunConfig& c, const std::string& v, const std::string& s) { c.FIELD = parse_toggle(v, s); }, \
          [](const RunConfig& c) { return toggle_name(c.FIELD); }}
#define WORD_KEY(NAME, FIELD, HINT, HELP, WORDS)                                                        \
  KeyImpl{{NAME, HINT, HELP},                                                                          \
          [](RunConfig& c, const std::string& v, const std::string& s) { c.FIELD = parse_word(v, s, WORDS()); }, \
          [](const RunConfig& c) { return word_of(c.FIELD, WORDS()); }}

const std::vector<KeyImpl>& key_table() {
  static const std::vector<KeyImpl> table = {
      PATH_KEY("model", model, "model directory in Hugging Face layout (config.json, *.safetensors, tokenizer.json)"),
      PATH_KEY("data", data, "training data, JSONL (text, prompt/completion, messages or input_ids per line)"),
      PATH_KEY("out", out, "run directory: checkpoints, metrics.jsonl, config.yaml, the final adapter"),
      PATH_KEY("eval-data", eval_data, "evaluation data, JSONL (instead of --eval-split)"),
      DOUBLE_KEY("eval-split", eval_split, "fraction of --data held out for evaluation (0: none)"),
      INT_KEY("seq-len", seq_len, "tokens per sequence; longer examples are cut at the end"),
      INT_KEY("batch-size", batch_size, "sequences per micro-batch"),
      INT_KEY("grad-accum", grad_accum, "micro-batches per optimizer step"),
      INT_KEY("epochs", epochs, "passes over the data"),
      INT_KEY("max-steps", max_steps, "stop after this many optimizer steps (0: run the epochs)"),
      DOUBLE_KEY("lr", lr, "peak learning rate"),
      WORD_KEY("lr-schedule", lr_schedule, "{constant,linear,cosine}", "learning-rate schedule after the warm-up",
               schedule_words),
      KeyImpl{{"warmup-steps", "N|auto", "linear warm-up steps (auto: 3% of the steps)"},
              [](RunConfig& c, const std::string& v, const std::string& s) { c.warmup_steps = v == "auto" ? -1 : parse_int(v, s); },
              [](const RunConfig& c) { return c.warmup_steps < 0 ? std::string("auto") : std::to_string(c.warmup_steps); }},
      DOUBLE_KEY("weight-decay", weight_decay, "AdamW weight decay (decoupled)"),
      DOUBLE_KEY("adam-beta1", adam_beta1, "AdamW beta1"),
      DOUBLE_KEY("adam-beta2", adam_beta2, "AdamW beta2"),
      DOUBLE_KEY("adam-eps", adam_eps, "AdamW epsilon"),
      DOUBLE_KEY("max-grad-norm", max_grad_norm, "clip the global gradient norm to this (0: no clipping)"),
      INT_KEY("lora-rank", lora_rank, "LoRA rank r"),
      DOUBLE_KEY("lora-alpha", lora_alpha, "LoRA alpha (scale = alpha / r, or alpha / sqrt(r) with --rslora)"),
      DOUBLE_KEY("lora-dropout", lora_dropout, "dropout on the adapters' input"),
      KeyImpl{{"lora-targets", "LIST", "projections with adapters: q,k,v,o,gate,up,down or all"},
              [](RunConfig& c, const std::string& v, const std::string& s) { c.lora_targets = parse_targets(v, s); },
              [](const RunConfig& c) {
                std::string out;
                for (const auto& t : c.lora_targets) out += (out.empty() ? "" : ",") + t.substr(0, t.size() - 5);
                return out;
              }},
      BOOL_KEY("rslora", rslora, "rank-stabilised LoRA: scale alpha / sqrt(r)"),
      WORD_KEY("quant", quant, "{nf4,none}", "frozen base weights: NF4 (QLoRA) or 16-bit", quant_words),
      BOOL_KEY("double-quant", double_quant, "quantise NF4's absmax too (QLoRA's double quantisation)"),
      WORD_KEY("precision", precision, "{auto,fp32,mixed}",
               "arithmetic: fp32 (reference), mixed (fp16 operands), auto (mixed where matrix cores exist)",
               precision_words),
      TOGGLE_KEY("grad-checkpointing", grad_checkpointing, "recompute each layer in the backward (auto: on from seq-len 1024)"),
      TOGGLE_KEY("packing", packing, "pack several examples per sequence (auto: on for {text} data)"),
      BOOL_KEY("no-shuffle", no_shuffle, "keep the file's order instead of shuffling each epoch"),
      BOOL_KEY("train-on-inputs", train_on_inputs, "loss on prompts and user turns too"),
      KeyImpl{{"chat-template", "NAME", "chat template for {messages} data (default: detected)"},
              [](RunConfig& c, const std::string& v, const std::string&) { c.chat_template = v; },
              [](const RunConfig& c) { return c.chat_template; }},
      KeyImpl{{"seed", "N", "seed of the adapter initialisation, shuffling and dropout"},
              [](RunConfig& c, const std::string& v, const std::string& s) {
                const int64_t x = parse_int(v, s);
                if (x < 0) throw UserError(s + ": the seed must be >= 0");
                c.seed = uint64_t(x);
              },
              [](const RunConfig& c) { return std::to_string(c.seed); }},
      PATH_KEY("init-adapter", init_adapter, "start from this PEFT adapter directory instead of a fresh one"),
      PATH_KEY("resume", resume, "continue a run from a checkpoint directory (or a run directory: its newest)"),
      INT_KEY("save-every", save_every, "steps between checkpoints (0: only at the end)"),
      INT_KEY("keep-checkpoints", keep_checkpoints, "newest checkpoints kept (0: all)"),
      INT_KEY("eval-every", eval_every, "steps between evaluations (0: only at the end)"),
      INT_KEY("log-every", log_every, "steps between log lines and metrics.jsonl rows"),
      KeyImpl{{"device", "N", "Vulkan device index (see forja devices)"},
              [](RunConfig& c, const std::string& v, const std::string& s) { c.device = int(parse_int(v, s)); },
              [](const RunConfig& c) { return std::to_string(c.device); }},
      BOOL_KEY("overwrite", overwrite, "replace a previous run in --out"),
      BOOL_KEY("resume-fallback", resume_fallback,
               "with --resume: pass over damaged checkpoints (SHA256SUMS) to the newest good one"),
      BOOL_KEY("skip-nonfinite", skip_nonfinite, "skip steps whose loss or gradients are not finite (counted)"),
  };
  return table;
}

// Keys that describe one run rather than how to reproduce it: not written to config.yaml.
bool is_invocation_key(const std::string& k) {
  return k == "resume" || k == "overwrite" || k == "device" || k == "resume-fallback";
}

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = [] {
    std::vector<ConfigKey> out;
    for (const auto& k : key_table()) out.push_back(k.meta);
    return out;
  }();
  return keys;
}

std::vector<std::string> config_key_names() {
  std::vector<std::string> names;
  for (const auto& k : key_table()) names.push_back(k.meta.name);
  return names;
}

void RunConfig::set(const std::string& key, const std::string& value, const std::string& source) {
  std::string k = key;
  std::replace(k.begin(), k.end(), '_', '-');  // lora_rank is accepted for lora-rank
  for (const auto& impl : key_table()) {
    if (k == impl.meta.name) {
      // A NUL or other control character (a path "my run\0 1" from a YAML escape) could not be
      // written back to config.yaml as it was read (found by fuzz/fuzz_run_config.cpp).
      for (unsigned char ch : value)
        if (ch < 0x20 && ch != '\t')
          throw UserError(source + ": the value contains a control character (byte " + std::to_string(int(ch)) +
                          "); give plain text");
      // Nor could bytes that are not UTF-8 (YAML's emitter escapes them as characters).
      if (const size_t bad = data::utf8_first_invalid(value); bad != std::string::npos)
        throw UserError(source + ": the value is not valid UTF-8 (at byte " + std::to_string(bad) + "); give plain text");
      impl.set(*this, value, source);
      explicitly_set[k] = value;
      return;
    }
  }
  const std::string near = nearest_name(k, config_key_names());
  throw UserError(source + ": unknown setting '" + key + "'" +
                  (near.empty() ? "; see forja train --help" : "; did you mean '" + near + "'?"));
}

void RunConfig::load_yaml(const fs::path& file) {
  if (!fs::is_regular_file(file)) throw UserError(file.string() + ": no such file (--config)");
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::Exception& e) {
    throw UserError(file.string() + ": not valid YAML (line " + std::to_string(e.mark.line + 1) + ": " + e.msg + ")");
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw UserError(file.string() + ": must be a mapping of setting: value, e.g. 'lr: 2e-4'");
  const fs::path base = fs::absolute(file).parent_path();
  for (const auto& item : root) {
    // Keys and list items that are not plain values (`[a]: 1`, `lora-targets: [q, [k]]`) would
    // make as<std::string>() throw YAML's exception (found by fuzz/fuzz_run_config.cpp).
    if (!item.first.IsScalar())
      throw UserError(file.string() + ": line " + std::to_string(item.first.Mark().line + 1) +
                      ": a setting's name must be a plain word, e.g. 'lr: 2e-4'");
    const std::string key = item.first.as<std::string>();
    const std::string where = file.string() + ": " + key;
    std::string value;
    if (item.second.IsSequence()) {  // lora-targets: [q, k, v]
      for (const auto& e : item.second) {
        if (!e.IsScalar()) throw UserError(where + ": expected a list of plain values, e.g. [q, k, v]");
        value += (value.empty() ? "" : ",") + e.as<std::string>();
      }
    } else if (item.second.IsScalar()) {
      value = item.second.as<std::string>();
    } else if (item.second.IsNull()) {
      continue;  // `eval-data:` left empty means unset
    } else {
      throw UserError(where + ": expected a single value");
    }
    if (key == "config") throw UserError(where + ": a config file cannot name another config file");
    // Paths in the file are relative to the file, so a run directory can be moved with its config.
    std::string name = key;
    std::replace(name.begin(), name.end(), '_', '-');
    for (const auto& impl : key_table())
      if (name == impl.meta.name && std::string_view(impl.meta.value_hint) == "PATH" && !value.empty() &&
          fs::path(value).is_relative())
        value = (base / value).string();
    set(key, value, where);
  }
}

void RunConfig::validate() const {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw UserError(msg);
  };
  need(!model.empty(), "--model is required (a model directory with config.json and *.safetensors)");
  need(!data.empty(), "--data is required (a JSONL file of training examples)");
  need(!out.empty(), "--out is required (the run directory to write)");
  need(eval_split >= 0 && eval_split < 1, "--eval-split must be in [0, 1), e.g. 0.05");
  need(eval_split == 0 || eval_data.empty(), "give either --eval-data or --eval-split, not both");
  need(seq_len >= 8 && seq_len <= (1 << 20), "--seq-len must be between 8 and 1048576");
  need(batch_size >= 1, "--batch-size must be at least 1");
  need(grad_accum >= 1, "--grad-accum must be at least 1");
  need(epochs >= 1, "--epochs must be at least 1");
  need(max_steps >= 0, "--max-steps must be >= 0 (0: run the epochs)");
  need(warmup_steps >= -1, "--warmup-steps must be >= 0 or auto");
  need(lr > 0 && lr < 1, "--lr must be in (0, 1), e.g. 2e-4");
  need(weight_decay >= 0, "--weight-decay must be >= 0");
  need(adam_beta1 >= 0 && adam_beta1 < 1, "--adam-beta1 must be in [0, 1)");
  need(adam_beta2 >= 0 && adam_beta2 < 1, "--adam-beta2 must be in [0, 1)");
  need(adam_eps > 0, "--adam-eps must be > 0");
  need(max_grad_norm >= 0, "--max-grad-norm must be >= 0 (0: no clipping)");
  need(lora_rank >= 1 && lora_rank <= 4096, "--lora-rank must be between 1 and 4096, e.g. 16");
  need(lora_alpha > 0, "--lora-alpha must be > 0, e.g. 32");
  need(lora_dropout >= 0 && lora_dropout < 1, "--lora-dropout must be in [0, 1)");
  need(save_every >= 0, "--save-every must be >= 0 (0: only at the end)");
  need(keep_checkpoints >= 0, "--keep-checkpoints must be >= 0 (0: keep all)");
  need(eval_every >= 0, "--eval-every must be >= 0");
  need(log_every >= 1, "--log-every must be at least 1");
}

std::string RunConfig::to_yaml() const {
  std::string out = "# forja train: the resolved configuration of this run (give it back with --config)\n";
  for (const auto& impl : key_table()) {
    const std::string name = impl.meta.name;
    if (is_invocation_key(name)) continue;
    YAML::Emitter e;
    e << YAML::DoubleQuoted << impl.get(*this);
    const std::string v = impl.get(*this);
    // Plain only what YAML cannot misread: words, numbers, paths and lists of letters, digits and
    // . / _ + = , -, not starting with '-' (a list item) nor spelling null. Anything else is
    // quoted: a path ending in " :" written plain did not load back (found by
    // fuzz/fuzz_run_config.cpp), nor would "~", "[x]", "&a" or "*a".
    const bool plain = !v.empty() && v.front() != '-' && v != "null" && v != "Null" && v != "NULL" &&
                       std::all_of(v.begin(), v.end(), [](char ch) {
                         return std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("./_+=,-", ch);
                       });
    out += name + ": " + (plain ? v : std::string(e.c_str())) + "\n";
  }
  return out;
}

int64_t RunConfig::warmup_for(int64_t total_steps) const {
  if (warmup_steps >= 0) return warmup_steps;
  return (total_steps * 3 + 99) / 100;
}

}  // namespace forja::train
