// Merging a LoRA adapter into its base model: W' = W + scale * B A for every adapted projection
// (scale = lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA), written as a Hugging Face
// checkpoint that transformers loads without PEFT: safetensors (sharded with
// model.safetensors.index.json when larger than the shard limit), config.json with torch_dtype
// set to the output dtype, and the tokenizer and generation files copied byte for byte. Every
// other tensor is copied bit-exact (or converted exactly when another dtype is asked for).
//
// Numerics: B A is accumulated in double precision from the stored factors, added to W widened
// to double, and the sum is rounded ONCE to the output dtype (round to nearest even), so each
// merged element is the correctly rounded value of W + scale * B A up to double's own error
// (~1e-16 relative). With MergeBase::nf4 the W is dequant(NF4(W)) exactly as training sees it
// (bitsandbytes-exact quantisation of the stored weight, fp32 dequantisation, quant/nf4.h), so
// the merged model is the QLoRA-trained model itself rather than its adapter on the 16-bit W.
//
// Runs on the CPU with threads: a merge is bound by reading and writing the checkpoint (8 GB each
// way for a 4B model), while B A costs 2 r out in flops per projection (~120 GFLOP for a 4B
// model at r = 16: seconds on a few cores), so a GPU would save little, and the CPU path needs
// no device, keeps double precision and runs where the model does not fit a GPU.
//
// Streaming: tensors are produced one at a time while the output is written; host memory beyond
// the mapped input files is one output tensor plus A widened to double ([r, in]).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace forja::model {

enum class MergeBase { original, nf4 };

struct MergeOptions {
  std::filesystem::path model_dir;    // Hugging Face model: config.json + safetensors
  std::filesystem::path adapter_dir;  // PEFT adapter: adapter_config.json + safetensors
  std::filesystem::path out_dir;
  MergeBase base = MergeBase::original;
  bool double_quant = true;          // MergeBase::nf4: as training's default
  std::optional<io::Dtype> dtype;    // nullopt ("auto"): every tensor keeps its dtype
  std::uint64_t max_shard_bytes = io::kDefaultMaxShardBytes;
  bool overwrite = false;            // replace a non-empty out_dir holding a model
  int threads = 0;                   // 0: std::thread::hardware_concurrency()
  std::function<void(const std::string&)> progress;  // optional one-line progress reports
};

struct MergeSummary {
  std::int64_t merged = 0;  // projection weights that received scale * B A
  std::int64_t copied = 0;  // every other tensor
  double scale = 0.0;
  std::int64_t rank = 0;
  std::string torch_dtype;                 // as written into config.json
  std::vector<std::string> weight_files;   // safetensors (+ index) written
  std::vector<std::string> copied_files;   // config, tokenizer and generation files
  std::uint64_t tensor_bytes = 0;
};

// Validates everything first (model, adapter shapes against the model, output path), then
// writes the merged model into a temporary directory next to out_dir and moves it into place
// (io/atomic_dir.h). Throws UserError naming the file, tensor or flag and the fix.
MergeSummary merge_adapter(const MergeOptions& options);

// A size as Hugging Face's max_shard_size spells it: "5GB", "500MB", "2GiB", "100KB", "4096"
// (bytes; KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024, case-insensitive). Throws
// UserError naming `flag` for anything else or for zero.
std::uint64_t parse_byte_size(const std::string& text, const std::string& flag);

// Files copied unchanged from the model directory when present.
const std::vector<std::string>& merge_copied_file_names();

// ---- rounding (exposed for tests) ----

// Correctly rounded (to nearest, ties to even) conversions of a double: double -> float is
// exact-then-rounded by the hardware; for the 16-bit formats the double is first rounded to
// float with round-to-odd, which keeps enough information for the second rounding to be correct
// (a plain double -> float -> bf16 would round twice and can be off by one ulp on ties).
float round_to_f32(double v);
std::uint16_t round_to_bf16(double v);
std::uint16_t round_to_f16(double v);

// Stores `v` rounded to `dtype` at `out` (2 or 4 bytes, little-endian, no alignment needed).
void store_rounded(io::Dtype dtype, double v, std::byte* out);

// Rows [row_begin, row_end) of W' = W + scale * B A, rounded to out_dtype into `out` (the whole
// [out_features, in_features] tensor's bytes). `weight(first, span)` yields W's elements
// [first, first + span.size()) as fp32; a is lora_A [r, in] widened to double with rows padded
// to `a_stride` (zeros); b is lora_B [out, r] in fp32. Exposed so tests can drive it directly.
using WeightReader = std::function<void(std::int64_t first, std::span<float> out)>;
// The row stride merge_rows needs for `a`: in_features rounded up to its tile (zeros beyond).
std::int64_t merge_a_stride(std::int64_t in_features);
void merge_rows(const WeightReader& weight, std::int64_t in_features, std::int64_t rank,
                const double* a, std::int64_t a_stride, const float* b, double scale,
                io::Dtype out_dtype, std::int64_t row_begin, std::int64_t row_end,
                std::span<std::byte> out);

}  // namespace forja::model
