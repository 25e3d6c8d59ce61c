// forja generate: text from a model (and optionally a LoRA adapter) on the GPU, with a KV cache.
//   forja generate --model DIR [--adapter DIR] --prompt TEXT    one answer, streamed to stdout
//   forja generate --model DIR [--adapter DIR] --chat           a conversation on stdin/stdout
// Sampling: greedy unless the model's generation_config.json asks for sampling (then its
// temperature / top_k / top_p) or --temperature > 0; flags override the file field by field.
// Prompts go through the model's chat template (as a user turn, with the generation prompt)
// unless --no-chat-template or the tokenizer has none. Generation stops at an end token
// (config.json, generation_config.json, tokenizer_config.json and the template's end of turn)
// or after --max-new-tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "cli/command.h"
#include "data/chat_template.h"
#include "data/text_stream.h"
#include "model/generation_config.h"
#include "model/generator.h"
#include "app/loaded_model.h"
#include "model/lora.h"
#include "model/sampler.h"
#include "util/error.h"

namespace {

using namespace forja;

struct GenerateArgs {
  std::string model, adapter, prompt, quant = "nf4";
  bool chat = false, no_chat_template = false, no_thinking = false;
  uint32_t max_new_tokens = 512, max_context = 0;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  std::optional<uint64_t> seed;
  int device = -1;
  // what CLI11 parses into; the optionals above say which were given
  double temperature_flag = 0, top_p_flag = 1;
  int64_t top_k_flag = 0;
  uint64_t seed_flag = 0;
};

model::BaseQuant parse_quant(const std::string& q) {
  if (q == "nf4") return model::BaseQuant::nf4;
  if (q == "none") return model::BaseQuant::none;
  throw UserError("--quant " + q + ": use nf4 (the default, as in training) or none (dense fp32 weights)");
}

model::SamplingSettings choose_sampling(const GenerateArgs& a, const model::GenerationConfig& g, std::string& note) {
  model::SamplingSettings s;
  const bool file_samples = g.do_sample;
  s.temperature = a.temperature ? *a.temperature : (file_samples ? g.temperature.value_or(1.0) : 0.0);
  s.top_k = a.top_k ? *a.top_k : (file_samples ? g.top_k.value_or(0) : 0);
  s.top_p = a.top_p ? *a.top_p : (file_samples ? g.top_p.value_or(1.0) : 1.0);
  if (s.temperature == 0) {
    note = "greedy decoding";
  } else {
    note = "sampling with temperature " + std::to_string(s.temperature).substr(0, 5) + ", top-k " +
           (s.top_k ? std::to_string(s.top_k) : std::string("off")) + ", top-p " + std::to_string(s.top_p).substr(0, 5);
  }
  if (file_samples && (!a.temperature || !a.top_k || !a.top_p))
    note += " (defaults from " + g.path + "; --temperature 0 for greedy)";
  return s;
}

// The ids that end generation: every end-of-sequence token the model's files name, and the
// chat template's end of turn.
std::vector<int32_t> stop_ids(const model::ModelConfig& config, const model::GenerationConfig& g,
                              const data::Tokenizer& tok, const data::ChatTemplate* tmpl) {
  std::vector<int32_t> ids;
  auto add = [&](int64_t id) {
    if (id >= 0 && id < config.vocab_size && std::find(ids.begin(), ids.end(), id) == ids.end())
      ids.push_back(static_cast<int32_t>(id));
  };
  for (int64_t id : config.eos_token_ids) add(id);
  for (int64_t id : g.eos_token_ids) add(id);
  if (auto e = tok.eos_id()) add(*e);
  if (tmpl)
    if (auto e = tok.token_id(tmpl->turn_end())) add(*e);
  return ids;
}

std::string bos_text(const data::Tokenizer& tok) { return tok.config().bos_token.value_or(""); }

// The longest context the model and its attention support.
uint32_t context_limit(const model::ModelConfig& c) {
  int64_t limit = c.max_position_embeddings > 0 ? c.max_position_embeddings : int64_t(1) << 20;
  if (c.sliding_window) limit = std::min(limit, *c.sliding_window);
  return static_cast<uint32_t>(std::min<int64_t>(limit, UINT32_MAX));
}

struct Session {
  gpu::Context& ctx;
  app::LoadedModel& m;
  const data::Tokenizer& tok;
  std::optional<data::ChatTemplate> tmpl;
  std::vector<int32_t> stops;
  model::Sampler sampler;
};

model::GenerationResult stream(Session& s, model::Generator& gen, std::span<const int32_t> prompt, uint32_t max_new) {
  data::TextStream text(s.tok);
  const auto t0 = std::chrono::steady_clock::now();
  auto choose = [&](std::span<const float> logits) { return s.sampler.next(logits); };
  auto on_token = [&](int32_t id) {
    if (std::find(s.stops.begin(), s.stops.end(), id) != s.stops.end()) return;  // not printed
    if (id >= s.tok.vocab_size()) return;  // an embedding row past the tokenizer's ids: no text
    const std::string piece = text.push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  model::GenerationResult r = model::generate(gen, prompt, max_new, s.stops, choose, on_token);
  const std::string rest = text.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const char* why = r.reason == model::StopReason::eos          ? "end token"
                    : r.reason == model::StopReason::max_tokens ? "--max-new-tokens reached"
                                                                : "context full";
  std::fprintf(stderr, "forja: %zu tokens after a %zu-token prompt in %.2f s (%.1f tokens/s), stopped: %s\n",
               r.tokens.size(), prompt.size(), sec, sec > 0 ? double(r.tokens.size()) / sec : 0.0, why);
  return r;
}

int run_generate(const GenerateArgs& a) {
  if (a.chat == !a.prompt.empty())
    throw UserError(a.chat ? "give either --prompt TEXT or --chat, not both"
                           : "give --prompt TEXT (one answer) or --chat (a conversation on stdin)");
  if (a.max_new_tokens == 0) throw UserError("--max-new-tokens must be at least 1");
  const model::BaseQuant quant = parse_quant(a.quant);
  const model::GenerationConfig gcfg = model::load_generation_config(a.model);
  std::string note;
  const model::SamplingSettings sampling = choose_sampling(a, gcfg, note);
  const uint64_t seed = a.seed ? *a.seed : std::random_device{}();
  model::Sampler sampler(sampling, seed);  // checks the settings before the slow loading

  auto ctx = gpu::Context::create(a.device);
  app::LoadedModel m(*ctx, a.model, {.quant = quant});
  std::unique_ptr<model::LoraSet> lora;
  if (!a.adapter.empty()) lora = model::load_adapter(*ctx, m.config, a.adapter);
  const data::Tokenizer& tok = *m.tokenizer;

  std::optional<data::ChatTemplate> tmpl;
  if (!a.no_chat_template && tok.config().chat_template) {
    tmpl = data::ChatTemplate::detect(tok.config());
  } else if (a.chat) {
    throw UserError(a.no_chat_template ? "--chat needs the chat template; drop --no-chat-template"
                                       : a.model +
                                             ": the tokenizer has no chat_template, so --chat cannot format "
                                             "a conversation; use --prompt");
  }
  Session s{*ctx, m, tok, tmpl, stop_ids(m.config, gcfg, tok, tmpl ? &*tmpl : nullptr), std::move(sampler)};
  std::fprintf(stderr, "forja: %s%s, %s, %s\n", m.dir.string().c_str(), lora ? (" + adapter " + a.adapter).c_str() : "",
               tmpl ? ("chat template " + tmpl->name()).c_str() : "no chat template", note.c_str());
  data::ChatRenderOptions render;
  render.add_generation_prompt = true;
  if (a.no_thinking) render.enable_thinking = false;
  const uint32_t limit = context_limit(m.config);

  if (!a.chat) {
    std::vector<int32_t> prompt;
    if (tmpl) {
      const data::ChatMessage user{"user", a.prompt, std::nullopt};
      prompt = tok.encode(tmpl->render_text(std::span(&user, 1), render, bos_text(tok)));
    } else {
      if (tok.config().add_bos_token)
        if (auto b = tok.bos_id()) prompt.push_back(*b);
      tok.encode_append(a.prompt, prompt);
    }
    if (prompt.empty()) throw UserError("--prompt: the prompt has no tokens");
    const uint64_t want = a.max_context ? a.max_context : prompt.size() + uint64_t(a.max_new_tokens);
    if (prompt.size() >= std::min<uint64_t>(want, limit))
      throw UserError("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
                      std::to_string(std::min<uint64_t>(want, limit)) + " leaves room for");
    model::Generator gen(*ctx, m.base, lora.get(), static_cast<uint32_t>(std::min<uint64_t>(want, limit)));
    stream(s, gen, prompt, a.max_new_tokens);
    return 0;
  }

  // Chat: the whole conversation is rendered each turn; the cache keeps the longest prefix it
  // shares with what was fed before, so only the new part is prefilled.
  const uint32_t max_context = std::min<uint32_t>(a.max_context ? a.max_context : 4096, limit);
  model::Generator gen(*ctx, m.base, lora.get(), max_context);
  std::vector<data::ChatMessage> history;
  std::vector<int32_t> cached;  // the ids in gen's cache
  std::fprintf(stderr,
               "forja: chat (context %u tokens). Type a message; /reset starts over, /exit or end of input "
               "quits.\n",
               max_context);
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    std::fflush(stderr);
    if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.clear();
      std::fprintf(stderr, "forja: conversation cleared\n");
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    history.push_back({"user", line, std::nullopt});
    const std::vector<int32_t> ids = tok.encode(tmpl->render_text(history, render, bos_text(tok)));
    if (ids.size() + 1 >= max_context) {
      history.pop_back();
      std::fprintf(stderr,
                   "forja: the conversation no longer fits the context of %u tokens; /reset to start over "
                   "(or a larger --max-context)\n",
                   max_context);
      continue;
    }
    size_t keep = 0;
    while (keep < cached.size() && keep < ids.size() && cached[keep] == ids[keep]) ++keep;
    keep = std::min(keep, ids.size() - 1);  // at least one token gives the logits
    gen.truncate(static_cast<uint32_t>(keep));
    cached.resize(keep);
    const std::span<const int32_t> fresh(ids.data() + keep, ids.size() - keep);
    const uint32_t room = max_context - static_cast<uint32_t>(ids.size());
    model::GenerationResult r = stream(s, gen, fresh, std::min(a.max_new_tokens, room));
    cached.insert(cached.end(), fresh.begin(), fresh.end());
    cached.insert(cached.end(), r.tokens.begin(), r.tokens.end() - (r.tokens.empty() ? 0 : 1));
    std::vector<int32_t> answer;
    for (int32_t id : r.tokens)
      if (id < tok.vocab_size() && std::find(s.stops.begin(), s.stops.end(), id) == s.stops.end()) answer.push_back(id);
    history.push_back({"assistant", tok.decode(answer, true), std::nullopt});
  }
  return 0;
}

forja::cli::CommandRegistration generate_registration{
    "generate", 60, [](CLI::App& app) {
      auto* cmd = app.add_subcommand("generate", "Generate text with a model and optionally a LoRA adapter");
      auto a = std::make_shared<GenerateArgs>();
      cmd->add_option("--model", a->model, "Hugging Face model directory (config.json, safetensors, tokenizer)")
          ->required();
      cmd->add_option("--adapter", a->adapter, "PEFT LoRA adapter directory (from forja train or PEFT)");
      cmd->add_option("--prompt", a->prompt, "Prompt text (one answer)");
      cmd->add_flag("--chat", a->chat, "Interactive conversation: one message per stdin line");
      cmd->add_option("--max-new-tokens", a->max_new_tokens, "Most tokens to generate per answer (default 512)");
      cmd->add_option("--max-context", a->max_context,
                      "KV cache length in tokens (default: prompt + --max-new-tokens; 4096 with --chat)");
      cmd->add_option("--temperature", a->temperature_flag,
                      "0 = greedy; > 0 samples (default: generation_config.json's, else greedy)");
      cmd->add_option("--top-k", a->top_k_flag, "Sample from the K most likely tokens (0 = all)");
      cmd->add_option("--top-p", a->top_p_flag, "Sample from the smallest set of tokens with probability >= P");
      cmd->add_option("--seed", a->seed_flag, "Random seed: the same seed gives the same sample");
      cmd->add_option("--quant", a->quant, "Base weights: nf4 (default, as in training) or none (fp32)");
      cmd->add_option("--device", a->device, "Vulkan device index (see forja devices)");
      cmd->add_flag("--no-chat-template", a->no_chat_template, "Feed --prompt as raw text");
      cmd->add_flag("--no-thinking", a->no_thinking, "Qwen3: answer without a think block (enable_thinking=false)");
      return [a, cmd]() -> int {
        if (!cmd->parsed()) return -1;
        if (cmd->count("--temperature")) a->temperature = a->temperature_flag;
        if (cmd->count("--top-k")) a->top_k = a->top_k_flag;
        if (cmd->count("--top-p")) a->top_p = a->top_p_flag;
        if (cmd->count("--seed")) a->seed = a->seed_flag;
        return run_generate(*a);
      };
    }};

}  // namespace
