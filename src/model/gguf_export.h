// `forja export --format gguf`: a PEFT LoRA adapter, or a whole model (optionally with an adapter
// merged in), as the GGUF files llama.cpp's own converters write (convert_lora_to_gguf.py and
// convert_hf_to_gguf.py), so that llama.cpp, ollama and LM Studio load them (docs/formats.md §8).
//
// Adapter (convert_lora_to_gguf.py): general.architecture = the base's llama.cpp architecture,
// general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (f32), and for every
// adapted projection "blk.N.<attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down>.weight"
// + ".lora_a" (PEFT's lora_A [r, in] as stored: ne = [in, r]) and ".lora_b" (lora_B [out, r]:
// ne = [r, out]). llama.cpp scales B·A by alpha / r; with rsLoRA (alpha / sqrt(r)) forja writes
// alpha·sqrt(r) so that llama.cpp applies the scale PEFT does (convert_lora_to_gguf.py writes
// lora_alpha as is and gets rsLoRA adapters wrong).
//
// Model (convert_hf_to_gguf.py): the architecture keys (<arch>.block_count, context_length,
// embedding_length, feed_forward_length, attention.head_count, head_count_kv, key_length,
// value_length, layer_norm_rms_epsilon, rope.freq_base; llama: vocab_size,
// rope.dimension_count, linear rope scaling keys, llama3 rope as a rope_freqs tensor), the
// byte-level BPE tokenizer (tokenizer.ggml.model "gpt2", pre "qwen2" or "llama-bpe", tokens,
// token_type, merges, bos/eos/padding ids, add_bos_token, chat_template) and the tensors
// token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v (+ .bias), attn_q_norm, attn_k_norm,
// attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}, output_norm, output (absent when tied).
// 1-D tensors are f32, matrices the chosen dtype.
//
// Llama-architecture models (Llama, Mistral) run RoPE on interleaved pairs in llama.cpp, so the
// rows of q_proj and k_proj (and of their lora_B) are permuted within each head as
// convert_hf_to_gguf.py's LlamaModel.permute does: row (h, i, j) of [heads, 2, d/2] goes to
// (h, j, i). Qwen2/Qwen3 use llama.cpp's NEOX rope, which is Hugging Face's half split: no
// permutation.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "io/gguf_writer.h"

namespace forja::model {

struct GgufExportOptions {
  std::filesystem::path model_dir;    // model export: the Hugging Face model
  std::filesystem::path adapter_dir;  // adapter export: the adapter; model export: merged in
  std::filesystem::path base_dir;     // adapter export: the base's config.json (default: the
                                      // adapter's base_model_name_or_path when a directory)
  std::filesystem::path out;
  io::GgmlType dtype = io::GgmlType::f32;
  bool overwrite = false;  // replace an existing --out file
  int threads = 0;         // merge threads (0: all cores)
};

struct GgufExportSummary {
  std::string architecture;  // llama.cpp's name: qwen3, qwen2, llama
  std::size_t tensors = 0;
  std::uint64_t file_bytes = 0;
  double lora_alpha = 0.0;  // adapter export: the alpha written
};

// Throw UserError naming the file and the fix for anything forja cannot export faithfully.
GgufExportSummary export_adapter_gguf(const GgufExportOptions& options);
GgufExportSummary export_model_gguf(const GgufExportOptions& options);

}  // namespace forja::model
