// forja eval: the mean loss and perplexity of a model (and optionally a LoRA adapter) on a
// dataset, through the training engine's forward (model::Transformer, no backward).
//   forja eval --model DIR [--adapter DIR] --data FILE [--seq-len S] [--batch-size B] [--json]
// The loss is the mean of -log p(target) over every loss token of the file (labels as forja
// train builds them: docs/formats.md 6.1), perplexity = exp(loss).
//
// --dump-logits FILE.safetensors (interoperability checks, small inputs only): also writes the
// first document of the first batch row as "input_ids" (F32 [T], exact integers) and its logits
// "logits" (F32 [T, V]) computed by the generator's prefill (model/generator.h).
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "model/generator.h"
#include "app/loaded_model.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "util/error.h"

namespace {

using namespace forja;

struct EvalArgs {
  std::string model, adapter, data, quant = "nf4", chat_template, dump_logits;
  int32_t seq_len = 0, batch_size = 4;
  int device = -1;
  bool json = false;
};

constexpr uint64_t kMaxDumpFloats = 64ull << 20;  // 256 MiB of logits

model::TokenBatch to_token_batch(const data::Batch& b) {
  model::TokenBatch t;
  t.batch = static_cast<uint32_t>(b.batch_size);
  t.seq = static_cast<uint32_t>(b.seq_len);
  t.input_ids = b.input_ids;
  t.positions = b.position_ids;
  t.segments = b.segment_ids;
  t.targets.resize(b.labels.size());
  for (uint32_t r = 0; r < t.batch; ++r)
    for (uint32_t s = 0; s < t.seq; ++s) {
      const size_t i = size_t(r) * t.seq + s;
      // the target of position s is the label of s + 1 (labels are not shifted)
      t.targets[i] = s + 1 < t.seq ? b.labels[i + 1] : data::kIgnoreLabel;
    }
  return t;
}

void dump_logits(gpu::Context& ctx, const app::LoadedModel& m, const model::LoraSet* lora, const data::Batch& b,
                 const std::string& path) {
  std::vector<int32_t> ids;
  for (int32_t s = 0; s < b.seq_len && b.segment_ids[s] == b.segment_ids[0] && b.segment_ids[0] != 0; ++s)
    ids.push_back(b.input_ids[s]);
  if (ids.empty()) throw UserError("--dump-logits: the first batch row holds no tokens");
  const uint64_t floats = ids.size() * uint64_t(m.config.vocab_size);
  if (floats > kMaxDumpFloats)
    throw UserError("--dump-logits: " + std::to_string(ids.size()) + " tokens x " +
                    std::to_string(m.config.vocab_size) +
                    " logits is too large to dump; use a shorter first example "
                    "or a smaller --seq-len");
  model::Generator gen(ctx, m.base, lora, static_cast<uint32_t>(ids.size()));
  std::vector<float> logits = gen.forward(ids, true);
  std::vector<float> ids_f(ids.begin(), ids.end());
  std::vector<io::TensorToWrite> t(2);
  t[0].name = "input_ids";
  t[0].shape = {int64_t(ids.size())};
  t[0].data = std::as_bytes(std::span(ids_f));
  t[1].name = "logits";
  t[1].shape = {int64_t(ids.size()), m.config.vocab_size};
  t[1].data = std::as_bytes(std::span(logits));
  io::write_safetensors(path, std::move(t), {{"producer", "forja eval --dump-logits"}});
  std::fprintf(stderr, "forja: wrote the logits of %zu tokens to %s\n", ids.size(), path.c_str());
}

int run_eval(const EvalArgs& a) {
  if (a.batch_size < 1) throw UserError("--batch-size must be at least 1");
  model::BaseQuant quant;
  if (a.quant == "nf4")
    quant = model::BaseQuant::nf4;
  else if (a.quant == "none")
    quant = model::BaseQuant::none;
  else
    throw UserError("--quant " + a.quant + ": use nf4 (the default, as in training) or none (dense fp32 weights)");
  if (a.seq_len < 0) throw UserError("--seq-len must be positive");
  auto ctx = gpu::Context::create(a.device, a.json);
  // Token-id data needs no tokenizer; the dataset asks for one when a line holds text.
  app::LoadedModel m(*ctx, a.model, {.quant = quant, .tokenizer_optional = true});
  std::unique_ptr<model::LoraSet> lora;
  if (!a.adapter.empty()) {
    lora = model::load_adapter(*ctx, m.config, a.adapter);
  } else {
    // The engine always runs with adapters; a zero one (B = 0) leaves the base model exact.
    model::LoraSettings none;
    none.rank = 1;
    none.targets.fill(false);
    none.targets[static_cast<int>(model::LinearKind::Q)] = true;
    lora = std::make_unique<model::LoraSet>(*ctx, m.config, none);
  }

  data::DatasetOptions o;
  o.seq_len = a.seq_len ? a.seq_len
                        : static_cast<int32_t>(std::min<int64_t>(
                              m.config.max_position_embeddings > 0 ? m.config.max_position_embeddings : 2048, 2048));
  o.shuffle = false;
  o.chat_template = a.chat_template;
  o.vocab_size = static_cast<int32_t>(m.config.vocab_size);
  o.tokenizer_file = std::filesystem::path(a.model) / "tokenizer.json";
  const auto split = data::Dataset::load(a.data, m.tokenizer ? &*m.tokenizer : nullptr, o);
  const data::Dataset& ds = split.train;
  const int64_t batches = ds.num_batches(0, a.batch_size);
  if (batches == 0) throw UserError(a.data + ": no examples to evaluate");

  gpu::Buffer loss_sum = ctx->alloc(16, "eval loss");
  ctx->fill(loss_sum, 0);
  uint64_t targets = 0;
  {
    model::Transformer tf(*ctx, m.base, *lora, static_cast<uint32_t>(a.batch_size), static_cast<uint32_t>(o.seq_len),
                          true);
    for (int64_t i = 0; i < batches; ++i) {
      const data::Batch b = ds.batch(0, i, a.batch_size);
      if (i == 0 && !a.dump_logits.empty())
        dump_logits(*ctx, m, a.adapter.empty() ? nullptr : lora.get(), b, a.dump_logits);
      if (b.rows == 0) continue;
      const model::TokenBatch tb = to_token_batch(b);
      targets += tb.target_count();
      tf.run(tb, 1.0f, loss_sum, false);
    }
  }
  const double sum = ctx->download<float>(loss_sum, 1)[0];
  ctx->free(loss_sum);
  if (targets == 0) throw UserError(a.data + ": no loss tokens (every label is -100)");
  const double loss = sum / double(targets), ppl = std::exp(loss);
  if (a.json) {
    nlohmann::json j = {{"loss", loss},
                        {"perplexity", ppl},
                        {"loss_tokens", targets},
                        {"batches", batches},
                        {"examples", ds.num_examples()},
                        {"seq_len", o.seq_len},
                        {"model", a.model},
                        {"adapter", a.adapter},
                        {"quant", a.quant}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("eval %s%s on %s: %lld examples, %llu loss tokens, loss %.6f, perplexity %.4f\n", a.model.c_str(),
                a.adapter.empty() ? "" : (" + " + a.adapter).c_str(), a.data.c_str(),
                static_cast<long long>(ds.num_examples()), static_cast<unsigned long long>(targets), loss, ppl);
  }
  return 0;
}

forja::cli::CommandRegistration eval_registration{
    "eval", 61, [](CLI::App& app) {
      auto* cmd = app.add_subcommand("eval", "Mean loss and perplexity of a model (+ adapter) on a dataset");
      auto a = std::make_shared<EvalArgs>();
      cmd->add_option("--model", a->model, "Hugging Face model directory")->required();
      cmd->add_option("--adapter", a->adapter, "PEFT LoRA adapter directory");
      cmd->add_option("--data", a->data, "JSONL dataset (the formats forja train reads)")->required();
      cmd->add_option("--seq-len", a->seq_len, "Tokens per row (default: min(2048, the model's maximum))");
      cmd->add_option("--batch-size", a->batch_size, "Rows per forward pass (default 4)");
      cmd->add_option("--quant", a->quant, "Base weights: nf4 (default, as in training) or none (fp32)");
      cmd->add_option("--chat-template", a->chat_template, "Chat template name for conversations (default: detect)");
      cmd->add_option("--device", a->device, "Vulkan device index (see forja devices)");
      cmd->add_flag("--json", a->json, "Print one JSON line");
      cmd->add_option("--dump-logits", a->dump_logits,
                      "Also write the first example's input ids and fp32 logits [T, V] (generator prefill) to this "
                      ".safetensors file (small inputs only)");
      return [a, cmd]() -> int {
        if (!cmd->parsed()) return -1;
        return run_eval(*a);
      };
    }};

}  // namespace
