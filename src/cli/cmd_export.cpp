// `forja export --format gguf`: a PEFT adapter as a llama.cpp LoRA GGUF (--adapter DIR [--base
// DIR]), or a whole model, with an adapter merged in when given (--model DIR [--adapter DIR]), as
// a llama.cpp model GGUF. The work is model/gguf_export.h; this file is the command line.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "model/gguf_export.h"
#include "util/error.h"

namespace {

using namespace forja;

forja::cli::CommandRegistration export_registration{"export", 65, [](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export", "Write an adapter or a model (with an adapter merged in) as GGUF for llama.cpp");
  auto o = std::make_shared<model::GgufExportOptions>();
  auto model_dir = std::make_shared<std::string>();
  auto adapter_dir = std::make_shared<std::string>();
  auto base_dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("gguf");
  auto dtype = std::make_shared<std::string>("auto");
  cmd->add_option("--model", *model_dir,
                  "model directory: export the whole model (with --adapter merged in)");
  cmd->add_option("--adapter", *adapter_dir,
                  "PEFT adapter directory: exported alone unless --model is given");
  cmd->add_option("--base", *base_dir,
                  "adapter export: the base model's directory (only config.json is read; default "
                  "the adapter's base_model_name_or_path)");
  cmd->add_option("--out", *out, "the .gguf file to write (atomically)")->required();
  cmd->add_option("--format", *format, "output format")
      ->check(CLI::IsMember(std::vector<std::string>{"gguf"}))
      ->capture_default_str();
  cmd->add_option("--dtype", *dtype,
                  "tensor type of the matrices (1-D tensors stay f32); auto: f32 for an adapter, "
                  "f16 for a model (the defaults of llama.cpp's converters)")
      ->check(CLI::IsMember({"auto", "f32", "f16", "bf16"}))
      ->capture_default_str();
  cmd->add_flag("--overwrite", o->overwrite, "replace an existing --out file");
  cmd->add_option("--threads", o->threads, "CPU threads for merging (default: all cores)")
      ->check(CLI::PositiveNumber);
  return [=]() -> int {
    if (!cmd->parsed()) return -1;
    // (the capture of `format` also keeps the string CLI11 writes --format into alive)
    if (*format != "gguf") throw UserError("--format " + *format + ": forja exports gguf");
    model::GgufExportOptions opt = *o;
    opt.model_dir = *model_dir;
    opt.adapter_dir = *adapter_dir;
    opt.base_dir = *base_dir;
    opt.out = *out;
    if (model_dir->empty() && adapter_dir->empty())
      throw UserError("export: give --adapter DIR (a LoRA GGUF) or --model DIR [--adapter DIR] (a model GGUF)");
    if (!model_dir->empty() && !base_dir->empty())
      throw UserError("export: --base is for an adapter export; with --model the model itself is the base");
    const bool whole_model = !model_dir->empty();
    if (*dtype == "f32" || (*dtype == "auto" && !whole_model)) opt.dtype = io::GgmlType::f32;
    if (*dtype == "f16" || (*dtype == "auto" && whole_model)) opt.dtype = io::GgmlType::f16;
    if (*dtype == "bf16") opt.dtype = io::GgmlType::bf16;
    const model::GgufExportSummary s =
        whole_model ? model::export_model_gguf(opt) : model::export_adapter_gguf(opt);
    if (whole_model)
      std::printf("wrote %s: %s model%s, %zu tensors (%s), %.3f GB\n", opt.out.string().c_str(),
                  s.architecture.c_str(), adapter_dir->empty() ? "" : " with the adapter merged in",
                  s.tensors, io::ggml_type_name(opt.dtype), static_cast<double>(s.file_bytes) / 1e9);
    else
      std::printf("wrote %s: %s LoRA adapter, %zu tensors (%s), alpha %g, %.3f MB\n",
                  opt.out.string().c_str(), s.architecture.c_str(), s.tensors,
                  io::ggml_type_name(opt.dtype), s.lora_alpha, static_cast<double>(s.file_bytes) / 1e6);
    return 0;
  };
}};

}  // namespace
