// forja tokenize: look at what training will see, without a GPU.
//   forja tokenize --model DIR --data FILE [--out FILE] [--seq-len N] [--chat-template NAME] ...
//       examples, tokens, truncation, packed rows and the fraction of tokens with loss; --out
//       writes each example's input_ids and labels as JSONL (in file order).
//   forja tokenize --model DIR --text STRING     the ids of STRING as a JSON array
//   forja tokenize --model DIR --decode 1,2,3    the text of those ids
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "util/error.h"

namespace {

struct TokenizeArgs {
  std::string model, data, out, text, decode, chat_template, eval_data;
  int32_t seq_len = 2048;
  bool train_on_inputs = false, skip_bad_lines = false, no_packing = false, packing = false;
  bool train_empty_think = false, skip_special = false;
  bool text_given = false;  // --text "" is a text too (its ids are []), so emptiness cannot tell
  double eval_split = 0.0;
  uint64_t seed = 42;
};

std::vector<int32_t> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t[]");
    const auto e = item.find_last_not_of(" \t[]");
    if (b == std::string::npos) continue;
    item = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < INT32_MIN || v > INT32_MAX)
      throw forja::UserError("--decode: \"" + item +
                             "\" is not an integer token id; give ids like --decode 9707,11,1879");
    ids.push_back(int32_t(v));
  }
  return ids;
}

int run_tokenize(const TokenizeArgs& a) {
  using namespace forja::data;
  const int modes = !a.data.empty() + a.text_given + !a.decode.empty();
  if (modes != 1)
    throw forja::UserError("tokenize: give exactly one of --data FILE, --text STRING, --decode IDS");
  const Tokenizer tok = Tokenizer::load(a.model);
  if (a.text_given) {
    std::printf("%s\n", nlohmann::json(tok.encode(a.text)).dump().c_str());
    return 0;
  }
  if (!a.decode.empty()) {
    std::printf("%s\n", tok.decode(parse_id_list(a.decode), a.skip_special).c_str());
    return 0;
  }
  DatasetOptions o;
  o.seq_len = a.seq_len;
  o.train_on_inputs = a.train_on_inputs;
  o.skip_bad_lines = a.skip_bad_lines;
  o.chat_template = a.chat_template;
  o.chat.train_empty_think = a.train_empty_think;
  o.seed = a.seed;
  o.eval_split = a.eval_split;
  o.eval_file = a.eval_data;
  if (a.no_packing) o.packing = false;
  if (a.packing) o.packing = true;
  const auto t0 = std::chrono::steady_clock::now();
  const auto split = Dataset::load(a.data, tok, o);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Dataset& ds = split.train;
  std::fprintf(stderr, "%s\n", ds.stats().summary().c_str());
  auto describe = [&](const char* name, const Dataset& d) {
    const int64_t rows = d.num_rows(0);
    std::fprintf(stderr,
                 "%s: %lld examples, %lld tokens (%lld with loss, %.1f%%), %s: %lld rows of %d "
                 "tokens (%.1f%% filled)\n",
                 name, (long long)d.num_examples(), (long long)d.tokens(),
                 (long long)d.loss_tokens(),
                 d.tokens() ? 100.0 * double(d.loss_tokens()) / double(d.tokens()) : 0.0,
                 d.packing() ? "packed" : "padded", (long long)rows, d.seq_len(),
                 rows ? 100.0 * double(d.tokens()) / (double(rows) * d.seq_len()) : 0.0);
  };
  describe("train", ds);
  if (split.eval) describe("eval", *split.eval);
  std::fprintf(stderr, "tokenized in %.2f s (%s)\n", sec, tok.origin().c_str());
  if (!a.out.empty()) {
    const std::string tmp = a.out + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary);
      if (!f) throw forja::UserError(a.out + ": cannot write; check the directory exists");
      auto dump = [&](const char* split_name, const Dataset& d) {
        for (int64_t i = 0; i < d.num_examples(); ++i) {
          const auto ex = d.example(i);
          nlohmann::json j = {{"line", d.line_of(i)}, {"split", split_name},
                              {"input_ids", ex.input_ids}, {"labels", ex.labels}};
          f << j.dump() << '\n';
        }
      };
      dump("train", ds);
      if (split.eval) dump("eval", *split.eval);
      if (!f.flush()) throw forja::UserError(a.out + ": write failed (disk full?)");
    }
    std::filesystem::rename(tmp, a.out);
    std::fprintf(stderr, "wrote %s\n", a.out.c_str());
  }
  return 0;
}

forja::cli::CommandRegistration tokenize_registration{"tokenize", 40, [](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tokenize", "Tokenize a dataset and report what training will see (no GPU needed)");
  auto a = std::make_shared<TokenizeArgs>();
  cmd->add_option("--model", a->model, "Model directory with tokenizer.json")->required();
  cmd->add_option("--data", a->data, "JSONL dataset to tokenize and summarise");
  cmd->add_option("--out", a->out, "Write each example's input_ids and labels here (JSONL)");
  auto* text = cmd->add_option("--text", a->text, "Print the token ids of this text as a JSON array");
  cmd->add_option("--decode", a->decode, "Print the text of these comma-separated ids");
  cmd->add_flag("--skip-special", a->skip_special, "With --decode: drop special tokens");
  cmd->add_option("--seq-len", a->seq_len, "Sequence length (examples are truncated to it)")
      ->capture_default_str();
  cmd->add_option("--chat-template", a->chat_template,
                  "Chat template: qwen3, qwen2.5, qwen2, chatml, llama3, llama3.1, mistral, mistral-v3 (default: detect)");
  cmd->add_flag("--train-on-inputs", a->train_on_inputs, "Loss on prompts and user turns too");
  cmd->add_flag("--train-empty-think", a->train_empty_think,
                "Qwen3: loss on the empty <think></think> block too");
  cmd->add_flag("--skip-bad-lines", a->skip_bad_lines, "Skip bad lines and report them");
  cmd->add_flag("--packing", a->packing, "Pack examples into full rows");
  cmd->add_flag("--no-packing", a->no_packing, "One example per row, padded");
  cmd->add_option("--eval-split", a->eval_split, "Fraction of examples held out for eval");
  cmd->add_option("--eval-data", a->eval_data, "Separate JSONL file for eval");
  cmd->add_option("--seed", a->seed, "Shuffle seed")->capture_default_str();
  return [a, cmd, text]() -> int {
    if (!cmd->parsed()) return -1;
    a->text_given = text->count() > 0;
    return run_tokenize(*a);
  };
}};

}  // namespace
