// The built-in example (`forja example`, the README's main job, and the tests' model): a tiny
// Qwen3 in Hugging Face layout and a small chat dataset, made from nothing, so that forja can be
// tried end to end without downloading anything.
//
// The model: config.json, model.safetensors (bf16, random normal(0, 0.02) weights as HF
// initialises them, an untied LM head of std 2/sqrt(hidden), norms near 1), tokenizer.json (byte-level BPE with Qwen's pre-tokenizer,
// 256 byte tokens plus merges learned from the example's own text), tokenizer_config.json (ChatML
// template, <|im_end|> as EOS), generation_config.json. The data: conversations asking for
// capitals and small sums, which LoRA on a random model can memorise in a few hundred steps.
#pragma once
#include <cstdint>
#include <filesystem>

namespace forja::train {

struct ExampleModelShape {
  int64_t hidden = 128, intermediate = 384, layers = 2, heads = 4, kv_heads = 2, head_dim = 32;
  int64_t merges = 200;  // BPE merges learned (vocabulary = 256 bytes + merges + 3 special, padded to 64)
  int64_t max_positions = 1024;
};

// Writes the model into `dir` (created; existing files of the same names are replaced).
void write_example_model(const std::filesystem::path& dir, uint64_t seed = 1,
                         const ExampleModelShape& shape = {});
// Writes the chat dataset (JSONL, {"messages": [...]} per line) and returns its example count.
int64_t write_example_data(const std::filesystem::path& file);

}  // namespace forja::train
