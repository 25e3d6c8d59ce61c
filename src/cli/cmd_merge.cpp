// `forja merge --model DIR --adapter DIR --out DIR`: folds a LoRA adapter into its base model
// (W + scale * B A) and writes a Hugging Face checkpoint that transformers loads without PEFT.
// The work is model::merge_adapter; this file is the command line and the report.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "model/merge.h"
#include "util/error.h"

namespace {

using namespace forja;

forja::cli::CommandRegistration merge_registration{"merge", 60, [](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "merge", "Merge a LoRA adapter into its base model and write a Hugging Face checkpoint");
  auto opts = std::make_shared<model::MergeOptions>();
  auto model_dir = std::make_shared<std::string>();
  auto adapter_dir = std::make_shared<std::string>();
  auto out_dir = std::make_shared<std::string>();
  auto from = std::make_shared<std::string>("original");
  auto dtype = std::make_shared<std::string>("auto");
  auto shard = std::make_shared<std::string>("5GB");
  auto double_quant = std::make_shared<std::string>("on");
  cmd->add_option("--model", *model_dir, "base model directory (config.json + safetensors)")
      ->required();
  cmd->add_option("--adapter", *adapter_dir,
                  "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)")
      ->required();
  cmd->add_option("--out", *out_dir, "output directory (written atomically)")->required();
  cmd->add_option("--from", *from,
                  "merge into the original 16-bit weights, or into dequant(NF4(W)) as QLoRA "
                  "training saw them")
      ->check(CLI::IsMember({"original", "nf4"}))
      ->capture_default_str();
  cmd->add_option("--double-quant", *double_quant,
                  "with --from nf4: NF4 absmax double quantisation, as in training")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--dtype", *dtype, "output dtype; auto keeps the checkpoint's")
      ->check(CLI::IsMember({"auto", "bf16", "f16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--max-shard-size", *shard,
                  "largest safetensors file, e.g. 5GB, 500MB, 2GiB (one model.safetensors when "
                  "everything fits)")
      ->capture_default_str();
  cmd->add_flag("--overwrite", opts->overwrite,
                "replace an existing non-empty --out (a model directory), once the new one is "
                "complete");
  cmd->add_option("--threads", opts->threads, "CPU threads (default: all cores)")
      ->check(CLI::PositiveNumber);
  return [=]() -> int {
    if (!cmd->parsed()) return -1;
    model::MergeOptions o = *opts;
    o.model_dir = *model_dir;
    o.adapter_dir = *adapter_dir;
    o.out_dir = *out_dir;
    o.base = *from == "nf4" ? model::MergeBase::nf4 : model::MergeBase::original;
    o.double_quant = *double_quant == "on";
    if (*dtype == "bf16") o.dtype = io::Dtype::BF16;
    if (*dtype == "f16") o.dtype = io::Dtype::F16;
    if (*dtype == "f32") o.dtype = io::Dtype::F32;
    o.max_shard_bytes = model::parse_byte_size(*shard, "--max-shard-size");
    o.progress = [](const std::string& line) { std::fprintf(stderr, "  %s\n", line.c_str()); };
    const auto start = std::chrono::steady_clock::now();
    const model::MergeSummary s = model::merge_adapter(o);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("merged %lld projections (r %lld, scale %g, from %s%s) into %s\n",
                (long long)s.merged, (long long)s.rank, s.scale, from->c_str(),
                o.base == model::MergeBase::nf4 ? (o.double_quant ? " + double quant" : "") : "",
                o.out_dir.string().c_str());
    std::printf("  %lld other tensors copied, %.3f GB of %s weights in", (long long)s.copied,
                static_cast<double>(s.tensor_bytes) / 1e9, s.torch_dtype.c_str());
    for (const std::string& f : s.weight_files) std::printf(" %s", f.c_str());
    std::printf("\n  copied:");
    for (const std::string& f : s.copied_files) std::printf(" %s", f.c_str());
    std::printf("\n  %.1f s\n", seconds);
    return 0;
  };
}};

}  // namespace
