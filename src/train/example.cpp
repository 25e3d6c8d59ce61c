#include "train/example.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "io/atomic_file.h"
#include "io/float16.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace forja::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::vector<std::pair<const char*, const char*>> kCapitals = {
    {"France", "Paris"},       {"Germany", "Berlin"},     {"Italy", "Rome"},         {"Spain", "Madrid"},
    {"Portugal", "Lisbon"},    {"Japan", "Tokyo"},        {"Canada", "Ottawa"},      {"Brazil", "Brasilia"},
    {"Egypt", "Cairo"},        {"Kenya", "Nairobi"},      {"Norway", "Oslo"},        {"Sweden", "Stockholm"},
    {"Finland", "Helsinki"},   {"Poland", "Warsaw"},      {"Greece", "Athens"},      {"Peru", "Lima"},
    {"Chile", "Santiago"},     {"India", "New Delhi"},    {"China", "Beijing"},      {"Austria", "Vienna"},
    {"Ireland", "Dublin"},     {"Mexico", "Mexico City"}, {"Turkey", "Ankara"},      {"Vietnam", "Hanoi"},
};

struct Qa {
  std::string question, answer;
};

std::vector<Qa> example_pairs() {
  std::vector<Qa> out;
  for (const auto& [country, capital] : kCapitals)
    out.push_back({std::string("What is the capital of ") + country + "?",
                   std::string("The capital of ") + country + " is " + capital + "."});
  for (int a = 2; a <= 9; a += 1)
    for (int b = 3; b <= 7; b += 2)
      out.push_back({"What is " + std::to_string(a) + " plus " + std::to_string(b) + "?",
                     std::to_string(a) + " plus " + std::to_string(b) + " is " + std::to_string(a + b) + "."});
  return out;
}

const char* kChatMlTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest for code points
// from 256 up, so every byte is one visible character in the vocabulary.
std::vector<std::string> byte_symbols() {
  std::vector<int> printable;
  for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
  std::vector<int> cp(256, -1);
  for (int b : printable) cp[size_t(b)] = b;
  int next = 256;
  for (int b = 0; b < 256; ++b)
    if (cp[size_t(b)] < 0) cp[size_t(b)] = next++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const int c = cp[size_t(b)];
    std::string s;
    if (c < 0x80) {
      s += char(c);
    } else {
      s += char(0xC0 | (c >> 6));
      s += char(0x80 | (c & 0x3F));
    }
    out[size_t(b)] = s;
  }
  return out;
}

// Byte-level BPE merges learned from `text` split at spaces (a space joins the word after it, as
// the pre-tokenizer does). Ties go to the lexicographically smallest pair, so it is deterministic.
std::vector<std::pair<std::string, std::string>> learn_merges(const std::string& text, int64_t count,
                                                              const std::vector<std::string>& sym) {
  std::map<std::vector<std::string>, int64_t> words;
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    std::vector<std::string> w;
    for (unsigned char ch : word) w.push_back(sym[ch]);
    ++words[w];
    word.clear();
  };
  for (char ch : text) {
    if (ch == ' ' || ch == '\n') flush();
    if (ch != '\n') word += ch;
    else flush();
  }
  flush();
  std::vector<std::pair<std::vector<std::string>, int64_t>> ws(words.begin(), words.end());
  std::vector<std::pair<std::string, std::string>> merges;
  while (int64_t(merges.size()) < count) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [w, n] : ws)
      for (size_t i = 0; i + 1 < w.size(); ++i) pairs[{w[i], w[i + 1]}] += n;
    if (pairs.empty()) break;
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;
    if (best->second < 2) break;
    const auto [a, b] = best->first;
    merges.push_back({a, b});
    for (auto& [w, n] : ws) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          merged.push_back(a + b);
          ++i;
        } else {
          merged.push_back(w[i]);
        }
      }
      w = std::move(merged);
    }
  }
  return merges;
}

std::string corpus_text() {
  std::string text;
  for (const auto& qa : example_pairs()) text += "user\n" + qa.question + "\nassistant\n" + qa.answer + "\n";
  return text;
}

}  // namespace

int64_t write_example_data(const fs::path& file) {
  std::string out;
  for (const auto& qa : example_pairs()) {
    json line = {{"messages", json::array({json{{"role", "user"}, {"content", qa.question}},
                                           json{{"role", "assistant"}, {"content", qa.answer}}})}};
    out += line.dump() + "\n";
  }
  if (!file.parent_path().empty()) fs::create_directories(file.parent_path());
  io::write_file_atomic(file, out);
  return int64_t(example_pairs().size());
}

void write_example_model(const fs::path& dir, uint64_t seed, const ExampleModelShape& s) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir.string() + ": cannot create the example model directory (" + ec.message() + ")");

  // Tokenizer: 256 byte tokens, the learned merges, then the three special tokens.
  const std::vector<std::string> sym = byte_symbols();
  const auto merges = learn_merges(corpus_text(), s.merges, sym);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[sym[size_t(b)]] = b;
  json merge_list = json::array();
  int64_t next_id = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next_id++;
    merge_list.push_back(json::array({a, b}));
  }
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  json added = json::array();
  const int64_t first_special = next_id;
  for (const char* sp : specials)
    added.push_back({{"id", next_id++}, {"content", sp}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  const int64_t vocab_size = (next_id + 63) / 64 * 64;
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  const json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({json{{"type", "Split"},
                           {"pattern",
                            {{"Regex",
                              "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                      byte_level})}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merge_list}}}};
  io::write_file_atomic(dir / "tokenizer.json", tokenizer.dump(1) + "\n");

  const int64_t eos = first_special + 2, pad = first_special;
  const json tokenizer_config = {{"tokenizer_class", "Qwen2Tokenizer"},
                                 {"bos_token", nullptr},
                                 {"eos_token", "<|im_end|>"},
                                 {"pad_token", "<|endoftext|>"},
                                 {"add_bos_token", false},
                                 {"add_eos_token", false},
                                 {"model_max_length", s.max_positions},
                                 {"chat_template", kChatMlTemplate}};
  io::write_file_atomic(dir / "tokenizer_config.json", tokenizer_config.dump(2) + "\n");

  const json config = {{"architectures", json::array({"Qwen3ForCausalLM"})},
                       {"model_type", "qwen3"},
                       {"vocab_size", vocab_size},
                       {"hidden_size", s.hidden},
                       {"intermediate_size", s.intermediate},
                       {"num_hidden_layers", s.layers},
                       {"num_attention_heads", s.heads},
                       {"num_key_value_heads", s.kv_heads},
                       {"head_dim", s.head_dim},
                       {"hidden_act", "silu"},
                       {"max_position_embeddings", s.max_positions},
                       {"rms_norm_eps", 1e-6},
                       {"rope_theta", 10000.0},
                       {"attention_bias", false},
                       {"tie_word_embeddings", false},
                       {"torch_dtype", "bfloat16"},
                       {"bos_token_id", pad},
                       {"eos_token_id", eos}};
  io::write_file_atomic(dir / "config.json", config.dump(2) + "\n");
  io::write_file_atomic(dir / "generation_config.json",
                        json{{"bos_token_id", pad}, {"eos_token_id", json::array({eos, pad})}, {"do_sample", false}}.dump(2) + "\n");

  // Weights, bf16, as a Qwen3ForCausalLM state dict.
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::vector<uint16_t>> storage;
  std::vector<io::TensorToWrite> tensors;
  // The LM head is untied and wider than HF's std 0.02: at 0.02 a model this narrow could not
  // produce logits beyond about +-1 after the final RMSNorm, so no adapter could bring the loss
  // far below log(V); std 2/sqrt(hidden) gives logits of std ~2 at the start and a reach of tens.
  // (Tied, such a head would also give each input token a huge logit for itself.)
  const float head_scale = 2.0f / std::sqrt(float(s.hidden)) / 0.02f;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm, float scale = 1.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = io::float_to_bf16(norm ? 1.0f + 10.0f * normal(rng) : scale * normal(rng));
    storage.push_back(std::move(v));
    io::TensorToWrite t;
    t.name = name;
    t.dtype = io::Dtype::BF16;
    t.shape = std::move(shape);
    t.data = std::as_bytes(std::span(storage.back()));
    tensors.push_back(std::move(t));
  };
  storage.reserve(size_t(5 + 11 * s.layers));
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  add("model.embed_tokens.weight", {vocab_size, s.hidden}, false);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {s.hidden}, true);
    add(p + "post_attention_layernorm.weight", {s.hidden}, true);
    add(p + "self_attn.q_norm.weight", {s.head_dim}, true);
    add(p + "self_attn.k_norm.weight", {s.head_dim}, true);
    add(p + "self_attn.q_proj.weight", {q, s.hidden}, false);
    add(p + "self_attn.k_proj.weight", {kv, s.hidden}, false);
    add(p + "self_attn.v_proj.weight", {kv, s.hidden}, false);
    add(p + "self_attn.o_proj.weight", {s.hidden, q}, false);
    add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, false);
    add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, false);
    add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, false);
  }
  add("model.norm.weight", {s.hidden}, true);
  add("lm_head.weight", {vocab_size, s.hidden}, false, head_scale);
  io::write_safetensors(dir / "model.safetensors", std::move(tensors));
}

}  // namespace forja::train
