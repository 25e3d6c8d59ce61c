// `forja inspect --model DIR`: what a model is and what training it will cost, before any GPU
// work: the architecture from config.json, parameter counts, bytes per part in 16-bit and NF4,
// a check of the safetensors against the config (headers only, nothing is read), and the
// estimated GPU memory of a QLoRA run with the given batch, sequence length and rank.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "cli/command.h"
#include "io/safetensors.h"
#include "model/bnb4.h"
#include "model/config.h"
#include "model/memory_plan.h"
#include "util/error.h"

namespace {

using namespace forja;

std::string with_commas(std::int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3)
    s.insert(static_cast<std::size_t>(i), ",");
  return (v < 0 ? "-" : "") + s;
}

std::string gb(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

const char* rope_name(model::RopeType t) {
  switch (t) {
    case model::RopeType::Default:
      return "default";
    case model::RopeType::Linear:
      return "linear";
    case model::RopeType::Llama3:
      return "llama3";
  }
  return "?";
}

// Compares checkpoint headers with the tensors the config implies. Returns a one-line summary.
std::string check_checkpoint(const std::filesystem::path& dir, const model::ModelConfig& c) {
  std::error_code ec;
  if (!std::filesystem::exists(dir / "model.safetensors", ec) &&
      !std::filesystem::exists(dir / "model.safetensors.index.json", ec))
    return "no safetensors weights found (config only)";
  io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir);
  std::map<std::string, int> dtypes;
  for (const model::ExpectedTensor& t : model::expected_tensors(c)) {
    if (model::is_bnb4_weight(ck, t.name)) {  // stored as NF4 codes: its quant state has the shape
      const std::vector<std::int64_t> shape = model::bnb4_weight_shape(ck, t.name);
      if (shape != t.shape)
        throw UserError(dir.string() + ": bitsandbytes weight '" + t.name + "' has shape " +
                        io::shape_text(shape) + " but config.json implies " + io::shape_text(t.shape) +
                        "; the weights and config.json belong to different models");
      dtypes["NF4 (bitsandbytes)"]++;
      continue;
    }
    const io::TensorInfo* info = ck.find(t.name);
    if (!info)
      throw UserError(
          dir.string() + ": checkpoint lacks tensor '" + t.name +
          "' that config.json implies; the "
          "weights and config.json belong to different models or the download is incomplete");
    if (info->shape != t.shape)
      throw UserError(dir.string() + ": tensor '" + t.name + "' has shape " +
                      io::shape_text(info->shape) + " but config.json implies " + io::shape_text(t.shape) +
                      "; the weights and config.json belong to different models");
    dtypes[io::dtype_name(info->dtype)]++;
  }
  std::string summary = std::to_string(ck.files().size()) + " file(s), " +
                        std::to_string(ck.names().size()) +
                        " tensors, all shapes match config.json; dtypes:";
  for (const auto& [name, count] : dtypes) summary += " " + name + " x" + std::to_string(count);
  if (c.tie_word_embeddings && ck.find("lm_head.weight"))
    summary += "; tied lm_head.weight present (ignored)";
  return summary;
}

forja::cli::CommandRegistration inspect_registration{
    "inspect", 30, [](CLI::App& app) {
      auto* cmd = app.add_subcommand(
          "inspect", "Show a model's architecture, sizes and the GPU memory a QLoRA run needs");
      auto model_dir = std::make_shared<std::string>();
      auto settings = std::make_shared<model::TrainingSettings>();
      auto no_dq = std::make_shared<bool>(false);
      auto fp32 = std::make_shared<bool>(false);
      cmd->add_option("--model", *model_dir,
                      "Hugging Face model directory (config.json + safetensors)")
          ->required();
      cmd->add_option("--seq-len", settings->seq_len, "tokens per sequence")
          ->check(CLI::PositiveNumber);
      cmd->add_option("--batch", settings->batch, "sequences per micro-batch")
          ->check(CLI::PositiveNumber);
      cmd->add_option("--lora-rank", settings->lora_rank, "LoRA rank r")
          ->check(CLI::PositiveNumber);
      cmd->add_flag("--no-double-quant", *no_dq, "NF4 absmax in fp32 instead of double-quantised");
      cmd->add_flag("--fp32", *fp32,
                    "Plan for --precision fp32 (fp32 dense weights, embedding and LM head) instead of mixed");
      return [=]() -> int {
        if (!cmd->parsed()) return -1;  // another subcommand was chosen
        const std::filesystem::path dir(*model_dir);
        const model::ModelConfig c = model::load_model_config(dir);
        const std::string weights = check_checkpoint(dir, c);  // errors before any output
        model::TrainingSettings s = *settings;
        s.double_quant = !*no_dq;
        // As the trainer plans (train/trainer.cpp): the engine keeps fp32 activations in both
        // precisions; mixed stores the dense weights in 16 bits.
        s.dense_weight_bytes = *fp32 ? 4 : 2;

        std::printf("model: %s (%s)\n", c.model_type.c_str(), dir.string().c_str());
        std::printf(
            "  layers %lld, hidden %lld, intermediate %lld, heads %lld (kv %lld), head_dim %lld, "
            "vocab %lld\n",
            (long long)c.num_layers, (long long)c.hidden_size, (long long)c.intermediate_size,
            (long long)c.num_heads, (long long)c.num_kv_heads, (long long)c.head_dim,
            (long long)c.vocab_size);
        std::printf("  LM head %s, q/k/v bias %s, qk-norm %s, rms_norm_eps %g, rope %s theta %g",
                    c.tie_word_embeddings ? "tied" : "untied", c.qkv_bias ? "yes" : "no",
                    c.qk_norm ? "yes" : "no", c.rms_norm_eps, rope_name(c.rope_scaling.type),
                    c.rope_theta);
        if (c.rope_scaling.type != model::RopeType::Default)
          std::printf(" factor %g", c.rope_scaling.factor);
        std::printf(", max positions %lld", (long long)c.max_position_embeddings);
        if (c.sliding_window) std::printf(", sliding window %lld", (long long)*c.sliding_window);
        std::printf("\n  weights: %s\n", weights.c_str());

        const model::ParameterCounts p = model::count_parameters(c);
        std::printf("parameters: %s\n", with_commas(p.total()).c_str());
        std::printf("  embedding %s, LM head %s, linear %s, norms %s, biases %s\n",
                    with_commas(p.embedding).c_str(),
                    c.tie_word_embeddings ? "(tied)" : with_commas(p.lm_head).c_str(),
                    with_commas(p.linear).c_str(), with_commas(p.norm).c_str(),
                    with_commas(p.bias).c_str());

        const model::WeightBytes w = model::weight_bytes(c);
        std::printf("weights in memory:\n");
        std::printf("  all 16-bit                 %s\n", gb(w.total_16bit()).c_str());
        std::printf("  linear 16-bit              %s\n", gb(w.linear_16bit).c_str());
        std::printf("  linear NF4                 %s\n", gb(w.linear_nf4).c_str());
        std::printf("  linear NF4 + double quant  %s\n", gb(w.linear_nf4_dq).c_str());
        std::printf("  embedding 16-bit           %s\n", gb(w.embedding_16bit).c_str());
        std::printf("  LM head 16-bit             %s\n", c.tie_word_embeddings
                                                             ? "shared with the embedding"
                                                             : gb(w.lm_head_16bit).c_str());
        std::printf("  norms + biases 16-bit      %s\n", gb(w.small_16bit).c_str());

        for (bool checkpointing : {true, false}) {
          s.checkpointing = checkpointing;
          const model::MemoryPlan plan = model::plan_training_memory(c, s);
          std::printf(
              "GPU memory estimate: batch %lld x seq %lld, LoRA r=%lld on 7 projections, --precision %s, "
              "checkpointing %s\n",
              (long long)s.batch, (long long)s.seq_len, (long long)s.lora_rank, *fp32 ? "fp32" : "mixed",
              checkpointing ? "on" : "off");
          for (const model::MemoryPart& part : plan.parts)
            std::printf("  %-34s %10s%s%s\n", part.name.c_str(), gb(part.bytes).c_str(),
                        part.note.empty() ? "" : "  ", part.note.c_str());
          std::printf("  %-34s %10s\n", "total", gb(plan.total()).c_str());
          // Devices that run the fused attention kernels (NVIDIA today) plan their attention
          // scratch otherwise and keep the attention outputs across checkpointing.
          model::TrainingSettings fused = s;
          fused.fused_attention_backward = true;
          if (model::keeps_attention_outputs(c, fused)) {
            const model::MemoryPlan f = model::plan_training_memory(c, fused);
            std::printf("  %-34s %10s  the fused kernels (NVIDIA) keep attention outputs where a quarter of the "
                        "GPU stays free\n",
                        "total, fused attention", gb(f.total()).c_str());
          }
        }
        return 0;
      };
    }};

}  // namespace
