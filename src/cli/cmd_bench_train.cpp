// forja bench --shape NAME: training speed on a model of a known shape with random weights
// (model/random_model.h), no files needed. Runs warm-up steps, then timed steps of the real
// training step (train::step, as forja train runs it: forward + backward through
// model::Transformer, then train::AdamW on the LoRA parameters) on one fixed random batch, and
// reports tokens/s, ms per step, the arena's peak GPU memory beside the memory plan's estimate,
// and the model FLOP utilisation (model/flops.h).
//
// This file also registers the `bench` command itself; `forja bench gemm` (cmd_bench_gemm.cpp)
// is its subcommand.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "gpu/context.h"
#include "gpu/vk_check.h"
#include "model/flops.h"
#include "model/lora.h"
#include "model/memory_plan.h"
#include "model/precision.h"
#include "model/random_model.h"
#include "model/transformer.h"
#include "ops/attention_gemm.h"
#include "train/optimizer.h"
#include "train/step.h"
#include "util/error.h"

namespace {

using namespace forja;

struct BenchOptions {
  std::string shape, quant = "nf4", precision = "auto", checkpointing = "on", attention = "automatic",
              lora_products = "automatic";
  int64_t batch = 0, seq_len = 0, lora_rank = 16, steps = 10, warmup = 2;
  double peak_tflops = 0;
  bool json = false;
  int device = -1;
  uint64_t seed = 0;
};

double gib(uint64_t bytes) { return static_cast<double>(bytes) / double(1ull << 30); }

// "1.234 GiB", or MiB below 1 GiB (the tiny shape's few hundred KiB still read as a number).
std::string bytes_text(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.3f GiB", gib(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.3f MiB", static_cast<double>(bytes) / double(1ull << 20));
  return buf;
}

// "4.02 B", "1.23 M": parameter and FLOP counts.
std::string count_text(double n) {
  char buf[32];
  if (n >= 1e9)
    std::snprintf(buf, sizeof buf, "%.3f B", n / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.3f M", n / 1e6);
  return buf;
}

// What checkpointing keeps besides the layer inputs, for the header: " (attention outputs and
// LoRA inputs kept)", one of them, or "".
std::string kept_text(bool attention, bool lora_inputs) {
  if (!attention && !lora_inputs) return "";
  return std::string(" (") + (attention ? "attention outputs" : "") + (attention && lora_inputs ? " and " : "") +
         (lora_inputs ? "LoRA inputs" : "") + " kept)";
}

std::string shape_list() {
  std::string list;
  for (const std::string& n : model::bench_shape_names()) list += (list.empty() ? "" : ", ") + n;
  return list;
}

// Rejects what cannot run, naming the flag and the valid range: first what needs no device,
// then (`device` given) the sequence length the device's storage bindings allow.
void check_options(const BenchOptions& o, const model::ModelConfig& c, const gpu::DeviceInfo* device) {
  if (!device) {
    if (o.batch < 1) throw UserError("--batch " + std::to_string(o.batch) + ": must be at least 1");
    if (o.seq_len < 2)
      throw UserError("--seq-len " + std::to_string(o.seq_len) + ": must be at least 2 (one token to predict)");
    if (double(o.batch) * double(o.seq_len) > double(std::numeric_limits<int32_t>::max()) /
                                                  double(std::max(c.hidden_size, c.intermediate_size)))
      throw UserError("--batch x --seq-len: " + std::to_string(o.batch) + " x " + std::to_string(o.seq_len) +
                      " tokens per step is more than the engine indexes; lower --batch or --seq-len");
    if (o.lora_rank < 1) throw UserError("--lora-rank must be at least 1");
    return;
  }
  // attention binds one sequence of q at a time (ops/attention.cpp)
  const uint64_t slack = std::max<uint64_t>(256, device->min_storage_offset_alignment);
  const int64_t binding_seq =
      static_cast<int64_t>((device->max_storage_buffer_range - slack) / (uint64_t(c.q_dim()) * 4));
  const int64_t max_seq = std::min(c.max_position_embeddings, binding_seq);
  if (o.seq_len > max_seq)
    throw UserError("--seq-len " + std::to_string(o.seq_len) + ": at most " + std::to_string(max_seq) +
                    " fits the " + o.shape + " shape on this device (max positions " +
                    std::to_string(c.max_position_embeddings) + ", one sequence per storage binding); choose 2.." +
                    std::to_string(max_seq));
}

int run_bench(BenchOptions o) {
  const model::ModelConfig c = model::bench_shape_config(o.shape);  // UserError listing the shapes
  check_options(o, c, nullptr);
  auto ctx = gpu::Context::create(o.device, o.json);
  check_options(o, c, &ctx->info());
  const uint32_t B = static_cast<uint32_t>(o.batch), S = static_cast<uint32_t>(o.seq_len);
  const bool checkpointing = o.checkpointing == "on";
  const bool nf4 = o.quant == "nf4";
  std::FILE* progress = o.json ? stderr : stdout;  // --json keeps stdout for the one JSON line

  model::BaseWeightOptions bo;
  bo.quant = nf4 ? model::BaseQuant::nf4 : model::BaseQuant::none;
  bo.double_quant = true;
  const model::Precision precision = model::resolve_precision(o.precision, *ctx);
  o.precision = model::precision_name(precision);  // what ran, for the report and the JSON line
  bo.dense_dtype = model::dense_dtype_for(precision);

  model::TrainingSettings plan_settings;
  plan_settings.batch = o.batch;
  plan_settings.seq_len = o.seq_len;
  plan_settings.lora_rank = o.lora_rank;
  plan_settings.double_quant = bo.double_quant;
  plan_settings.nf4 = nf4;
  plan_settings.dense_weight_bytes = precision == model::Precision::mixed ? 2 : 4;
  plan_settings.checkpointing = checkpointing;
  plan_settings.fused_attention_backward =
      precision == model::Precision::mixed &&
      ops::attention_fused_backward_enabled(*ctx, static_cast<uint32_t>(c.head_dim));
  plan_settings.attention_qk_f16 =
      model::attention_keeps_fp16_qk(*ctx, c, static_cast<uint32_t>(plan_settings.batch),
                                     static_cast<uint32_t>(plan_settings.seq_len), plan_settings.fused_attention_backward);
  // the engine keeps attention outputs with the GEMM path's fused backward and fp16 LoRA products only
  plan_settings.keep_attention = (o.attention == "automatic" || o.attention == "gemm") && o.lora_products != "fp32";
  model::choose_kept_activations(c, plan_settings, ctx->info().device_local_bytes());
  const model::MemoryPlan plan = model::plan_training_memory(c, plan_settings);
  const model::StepFlops flops =
      model::training_step_flops(c, o.batch, o.seq_len, o.lora_rank, plan_settings.targets);

  const model::ParameterCounts params = model::count_parameters(c);
  std::fprintf(progress, "forja bench: %s, random weights (seed %llu), on %s\n", o.shape.c_str(),
               (unsigned long long)o.seed, ctx->info().name.c_str());
  std::fprintf(progress, "  %lld layers, hidden %lld, intermediate %lld, heads %lld (kv %lld) x %lld, vocab %lld, %s; "
               "%s parameters (%s in projections)\n",
               (long long)c.num_layers, (long long)c.hidden_size, (long long)c.intermediate_size,
               (long long)c.num_heads, (long long)c.num_kv_heads, (long long)c.head_dim, (long long)c.vocab_size,
               c.tie_word_embeddings ? "tied LM head" : "untied LM head", count_text(double(params.total())).c_str(),
               count_text(double(params.linear)).c_str());
  std::fprintf(progress, "  batch %u x seq %u = %u tokens/step, base %s, %s, LoRA r=%lld on 7 projections, "
               "checkpointing %s, %lld warm-up + %lld timed steps\n",
               B, S, B * S, nf4 ? "NF4 (double quant)" : "fp32 (not quantised)", o.precision.c_str(),
               (long long)o.lora_rank,
               (o.checkpointing + kept_text(model::keeps_attention_outputs(c, plan_settings),
                                            model::keeps_lora_inputs(c, plan_settings)))
                   .c_str(),
               (long long)o.warmup, (long long)o.steps);
  std::fflush(progress);

  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  std::vector<double> losses, step_seconds;
  uint64_t host_waits = 0;  // the most times one step waited for the GPU (train/step.h: 1)
  try {
    const auto build0 = clock::now();
    model::BaseWeights base = model::random_base_weights(*ctx, c, bo, o.seed);
    std::fprintf(progress, "  random base built in %.1f s (%s on the GPU)\n", seconds_since(build0),
                 bytes_text(base.gpu_bytes).c_str());
    std::fflush(progress);
    {
      model::LoraSettings ls;
      ls.rank = o.lora_rank;
      ls.alpha = 2.0 * double(o.lora_rank);
      model::LoraSet lora(*ctx, c, ls);
      lora.init_peft(o.seed);  // B = 0 as PEFT: the first loss is the base model's
      model::TransformerOptions to{precision};
      using Attention = model::TransformerOptions::Attention;
      to.attention = o.attention == "tiled"  ? Attention::tiled
                     : o.attention == "gemm" ? Attention::gemm
                     : o.attention == "flash" ? Attention::flash
                                             : Attention::automatic;
      using LoraProducts = model::TransformerOptions::LoraProducts;
      to.lora_products = o.lora_products == "fp32"   ? LoraProducts::fp32
                         : o.lora_products == "fp16" ? LoraProducts::fp16
                                                     : LoraProducts::automatic;
      to.keep_attention = plan_settings.keep_attention;
      to.keep_lora_inputs = plan_settings.keep_lora_inputs;
      model::Transformer tf(*ctx, base, lora, B, S, checkpointing, to);
      train::OptimizerSettings os;
      os.total_steps = o.warmup + o.steps;
      train::AdamW adamw(*ctx, lora, os);
      const model::TokenBatch batch = model::random_token_batch(B, S, c.vocab_size, o.seed);
      gpu::Buffer loss_sum = ctx->alloc(16, "loss");
      const train::StepEngine engine{*ctx, tf, lora, adamw, loss_sum};
      train::StepInput in;
      in.micro_batches = {{&batch, 0}};
      in.targets = batch.target_count();
      for (int64_t step = 0; step < o.warmup + o.steps; ++step) {
        ctx->finish();
        const auto t0 = clock::now();
        in.step = step;
        const uint64_t drains0 = ctx->drains();
        const train::StepResult r = train::step(engine, in);
        host_waits = std::max(host_waits, ctx->drains() - drains0);
        ctx->finish();  // AdamW's update is part of the step's time
        const double dt = seconds_since(t0);
        const double loss = r.loss;
        if (!r.applied && ctx->skipped_ops().empty())  // (FORJA_SKIP_OPS: the numbers are wrong anyway)
          throw std::runtime_error("the loss (" + std::to_string(loss) + ") or gradient norm (" +
                                   std::to_string(r.grad_norm) + ") of step " + std::to_string(step) +
                                   " is not finite");
        losses.push_back(loss);
        const bool timed = step >= o.warmup;
        if (timed) step_seconds.push_back(dt);
        std::fprintf(progress, "  step %3lld%s  loss %.5f  %9.1f ms\n", (long long)step, timed ? "" : " (warm-up)", loss,
                     dt * 1e3);
        std::fflush(progress);
      }
      ctx->free(loss_sum);
    }
    model::free_base_weights(*ctx, base);
  } catch (const gpu::OutOfMemory& e) {
    throw gpu::OutOfMemory(std::string(e.what()) +
                           "; lower --batch or --seq-len, turn --grad-checkpointing on, or use --quant nf4");
  }

  double total = 0;
  for (double s : step_seconds) total += s;
  const double step_s = total / double(step_seconds.size());
  const double tokens_per_s = double(B) * S / step_s;
  const double achieved_tflops = flops.total() / step_s / 1e12;
  const double mfu = o.peak_tflops > 0 ? achieved_tflops / o.peak_tflops : 0;
  const uint64_t peak = ctx->arena().peak_bytes(), reserved = ctx->arena().bytes_reserved();

  if (o.json) {
    nlohmann::json j = {{"shape", o.shape},
                        {"batch", o.batch},
                        {"seq", o.seq_len},
                        {"quant", o.quant},
                        {"precision", o.precision},
                        {"attention", o.attention},
                        {"lora_products", o.lora_products},
                        {"rank", o.lora_rank},
                        {"grad_ckpt", checkpointing},
                        {"kept_attention", model::keeps_attention_outputs(c, plan_settings)},
                        {"kept_lora_inputs", model::keeps_lora_inputs(c, plan_settings)},
                        {"steps", o.steps},
                        {"tokens_per_s", tokens_per_s},
                        {"step_ms", step_s * 1e3},
                        {"host_waits_per_step", host_waits},
                        {"peak_gib", gib(peak)},
                        {"reserved_gib", gib(reserved)},
                        {"plan_gib", gib(plan.total())},
                        {"model_tflop_per_step", flops.total() / 1e12},
                        {"tflops", achieved_tflops},
                        {"mfu", o.peak_tflops > 0 ? nlohmann::json(mfu) : nlohmann::json(nullptr)},
                        {"peak_tflops", o.peak_tflops > 0 ? nlohmann::json(o.peak_tflops) : nlohmann::json(nullptr)},
                        {"loss_first", losses.front()},
                        {"loss_last", losses.back()},
                        {"device", ctx->info().name}};
    if (!ctx->skipped_ops().empty()) j["skipped_ops"] = ctx->skipped_ops();
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  const auto [fastest, slowest] = std::minmax_element(step_seconds.begin(), step_seconds.end());
  std::printf("result:\n");
  if (!ctx->skipped_ops().empty())
    std::printf("  FORJA_SKIP_OPS left out %llu dispatches: timing only, the losses are not this model's\n",
                (unsigned long long)ctx->dispatches_skipped());
  std::printf("  tokens/s          %.1f\n", tokens_per_s);
  std::printf("  ms/step           %.2f (mean of %zu; min %.2f, max %.2f)\n", step_s * 1e3, step_seconds.size(),
              *fastest * 1e3, *slowest * 1e3);
  std::printf("  host waits        %llu per step (for the loss and the gradient norm)\n",
              (unsigned long long)host_waits);
  std::printf("  peak GPU memory   %s allocated (arena peak; %s reserved in blocks)\n", bytes_text(peak).c_str(),
              bytes_text(reserved).c_str());
  // FORJA_ARENA_PEAK=1: what was live at the peak, by allocation name.
  for (const auto& [name, bytes] : ctx->arena().peak_breakdown())
    std::printf("    at peak: %-36s %s\n", name.empty() ? "(unnamed)" : name.c_str(), bytes_text(bytes).c_str());
  std::printf("  memory plan       %s estimated (model/memory_plan.h):\n", bytes_text(plan.total()).c_str());
  for (const model::MemoryPart& part : plan.parts)
    if (part.bytes) std::printf("    %-26s %12s\n", part.name.c_str(), bytes_text(part.bytes).c_str());
  std::printf("  model FLOPs       %.4g per step (base forward %.4g, base input gradients %.4g, LoRA %.4g, "
              "attention %.4g) = %.4g TFLOP/s\n",
              flops.total(), flops.base_forward, flops.base_backward, flops.lora, flops.attention, achieved_tflops);
  if (o.peak_tflops > 0)
    std::printf("  MFU               %.3g%% of %.1f TFLOP/s\n", 100.0 * mfu, o.peak_tflops);
  else
    std::printf("  MFU               (give --peak-tflops, e.g. 989 for an H200's dense bf16)\n");
  std::printf("  loss              %.5f first step, %.5f last step\n", losses.front(), losses.back());
  std::printf("  %s\n", model::training_step_flops_formula());
  return 0;
}

forja::cli::CommandRegistration bench_train_registration{"bench", 80, [](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Training speed on a random model of a known shape (forja bench --shape tiny ...); "
               "forja bench gemm: GEMM kernels");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("--shape", o->shape, "Model shape: " + shape_list());
  auto* batch = cmd->add_option("--batch", o->batch, "Sequences per step");
  auto* seq = cmd->add_option("--seq-len", o->seq_len, "Tokens per sequence");
  cmd->add_option("--quant", o->quant, "Base projection weights: nf4 (QLoRA) or none (fp32)")
      ->check(CLI::IsMember({"nf4", "none"}));
  cmd->add_option("--precision", o->precision, "fp32, mixed or auto (mixed where matrix cores exist)")
      ->check(CLI::IsMember({"auto", "fp32", "mixed"}));
  cmd->add_option("--attention", o->attention,
                  "Attention implementation: automatic, tiled (fp32 kernels), gemm (through the GEMMs; mixed), "
                  "flash (fused kernels)")
      ->check(CLI::IsMember({"automatic", "tiled", "gemm", "flash"}));
  cmd->add_option("--lora-products", o->lora_products,
                  "Operands of LoRA's rank-r products in mixed precision: automatic (fp16), fp16 (matrix cores), "
                  "fp32 (scalar kernels)")
      ->check(CLI::IsMember({"automatic", "fp16", "fp32"}));
  cmd->add_option("--lora-rank", o->lora_rank, "LoRA rank on all seven projections");
  cmd->add_option("--grad-checkpointing", o->checkpointing, "Activation checkpointing: on or off")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--steps", o->steps, "Timed steps")->check(CLI::Range(int64_t(1), int64_t(100000)));
  cmd->add_option("--warmup", o->warmup, "Untimed steps first")->check(CLI::Range(int64_t(0), int64_t(100000)));
  cmd->add_option("--peak-tflops", o->peak_tflops, "The GPU's peak TFLOP/s, for the MFU (H200 dense bf16: 989)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o->seed, "Seed of the random weights, LoRA init and tokens");
  cmd->add_flag("--json", o->json, "Print one JSON line (progress goes to stderr)");
  cmd->add_option("--device", o->device, "Vulkan device index");
  return [o, cmd, batch, seq]() -> int {
    if (!cmd->parsed() || !cmd->get_subcommands().empty()) return -1;  // not bench, or bench gemm
    if (o->shape.empty())
      throw UserError("forja bench: give --shape (" + shape_list() + ") with --batch and --seq-len, "
                      "or use forja bench gemm");
    if (batch->count() == 0 || seq->count() == 0)
      throw UserError("forja bench --shape " + o->shape + ": give --batch B and --seq-len S (e.g. --batch 1 --seq-len 2048)");
    return run_bench(*o);
  };
}};

}  // namespace
