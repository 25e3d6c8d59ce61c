// libFuzzer target for one JSONL dataset line (data/dataset.h tokenize_line) in all four formats
// ({"text"}, {"messages"}, {"prompt","completion"}, {"input_ids"[,"labels"]}), with the example
// model's tokenizer and each chat template. The first byte picks the options (template, train on
// inputs, no tokenizer, a small id range), the rest is the line. A line is tokenized or rejected
// with BadLineError/UserError; a tokenized one must have labels aligned with in-range ids.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "fuzz_support.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const forja::data::Tokenizer tokenizer =
      forja::data::Tokenizer::load(forja::fuzz::example_model_dir());
  static const std::vector<forja::data::ChatTemplate> templates = [] {
    std::vector<forja::data::ChatTemplate> t;
    for (const std::string& name : forja::data::ChatTemplate::names())
      t.push_back(forja::data::ChatTemplate::by_name(name));
    return t;
  }();
  if (size == 0) return 0;
  const std::uint8_t pick = data[0];
  const std::string_view line(reinterpret_cast<const char*>(data + 1), size - 1);

  forja::data::DatasetOptions options;
  options.train_on_inputs = pick & 1;
  options.add_eos = pick & 2;
  const bool no_tokenizer = (pick & 4) && (pick & 8);
  options.vocab_size = (pick & 16) ? 100 : 0;
  options.chat.train_empty_think = pick & 32;
  const forja::data::ChatTemplate* chat = &templates[(pick >> 6) % templates.size()];
  const forja::data::Tokenizer* tok = no_tokenizer ? nullptr : &tokenizer;
  const std::int32_t limit = options.vocab_size ? options.vocab_size : tokenizer.vocab_size();
  try {
    std::string format;
    const forja::data::TokenizedExample ex =
        forja::data::tokenize_line(line, "data.jsonl:1", tok, chat, options, &format);
    if (ex.labels.size() != ex.input_ids.size() || format.empty()) std::abort();
    for (std::size_t i = 0; i < ex.input_ids.size(); ++i) {
      if (ex.input_ids[i] < 0 || (tok && ex.input_ids[i] >= limit)) std::abort();
      if (ex.labels[i] != -100 && ex.labels[i] != ex.input_ids[i] && ex.labels[i] < 0) std::abort();
    }
  } catch (const forja::UserError&) {
  }
  return 0;
}
