// JSONL datasets: validation and tokenization per line, the line index, eval split, shuffling,
// packing and batches. See dataset.h for the formats and conventions.
#include "data/dataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <ios>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "data/utf8.h"

namespace forja::data {
namespace {

using nlohmann::json;

const char* kSkipHint = " (or pass --skip-bad-lines to skip such lines)";

[[noreturn]] void bad(const std::string& kind, const std::string& where, const std::string& what) {
  throw BadLineError(kind, where + ": " + what + kSkipHint);
}

std::string type_name(const json& j) {
  if (j.is_string()) return "a string";
  if (j.is_number_integer()) return "an integer";
  if (j.is_number()) return "a number";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  if (j.is_boolean()) return "a boolean";
  return "null";
}

const std::string& get_string(const json& obj, const char* key, const std::string& where,
                              const std::string& field) {
  auto it = obj.find(key);
  if (it == obj.end()) bad("missing field", where, "field " + field + " is missing");
  if (!it->is_string())
    bad("wrong type", where, "field " + field + " is " + type_name(*it) + "; expected a string");
  return it->get_ref<const std::string&>();
}

std::vector<ChatMessage> parse_messages(const json& arr, const std::string& where,
                                        const std::string& field) {
  if (!arr.is_array())
    bad("wrong type", where, "field " + field + " is " + type_name(arr) +
                                 "; expected an array of {\"role\", \"content\"} objects");
  if (arr.empty()) bad("empty example", where, "field " + field + " is an empty array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string f = field + "[" + std::to_string(i) + "]";
    const json& m = arr[i];
    if (!m.is_object())
      bad("wrong type", where, f + " is " + type_name(m) + "; expected {\"role\", \"content\"}");
    ChatMessage msg;
    msg.role = get_string(m, "role", where, f + ".role");
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool")
      bad("bad role", where, f + ".role is \"" + msg.role +
                                 "\"; expected system, user, assistant or tool");
    auto c = m.find("content");
    if (c == m.end()) bad("missing field", where, "field " + f + ".content is missing");
    if (c->is_null() && msg.role == "assistant") {
      msg.content.clear();
    } else if (!c->is_string()) {
      bad("wrong type", where, "field " + f + ".content is " + type_name(*c) +
                                   "; expected a string");
    } else {
      msg.content = c->get<std::string>();
    }
    if (auto r = m.find("reasoning_content"); r != m.end() && !r->is_null()) {
      if (!r->is_string())
        bad("wrong type", where, "field " + f + ".reasoning_content is " + type_name(*r) +
                                     "; expected a string");
      msg.reasoning_content = r->get<std::string>();
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<int32_t> parse_ids(const json& arr, const std::string& where, const std::string& field,
                               int32_t vocab, bool allow_ignore) {
  if (!arr.is_array())
    bad("wrong type", where, "field " + field + " is " + type_name(arr) +
                                 "; expected an array of integers");
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& v = arr[i];
    if (!v.is_number_integer())
      bad("wrong type", where, field + "[" + std::to_string(i) + "] is " + type_name(v) +
                                   "; expected an integer token id");
    const int64_t id = v.get<int64_t>();
    if (allow_ignore && id == kIgnoreLabel) {
      ids.push_back(kIgnoreLabel);
      continue;
    }
    if (id < 0 || id >= vocab)
      bad("token id out of range", where,
          field + "[" + std::to_string(i) + "] = " + std::to_string(id) +
              " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")" +
              (allow_ignore ? " and is not -100" : "") +
              "; the ids were made with another tokenizer");
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::string known_templates() {
  std::string known;
  for (const auto& n : ChatTemplate::names()) known += (known.empty() ? "" : ", ") + n;
  return known;
}

// Tokenizes text parts; trainable[k] says whether part k has loss.
void encode_labelled(const Tokenizer& tok, const std::vector<std::string_view>& parts,
                     const std::vector<bool>& trainable, bool train_all, TokenizedExample& ex) {
  // Ids already in ex (a BOS) are prompt.
  const size_t first = ex.input_ids.size();
  std::vector<int32_t> part;
  tok.encode_parts(parts, ex.input_ids, part);
  ex.labels.assign(ex.input_ids.size(), kIgnoreLabel);
  for (size_t i = first; i < ex.input_ids.size(); ++i)
    if (train_all || trainable[size_t(part[i - first])]) ex.labels[i] = ex.input_ids[i];
}

// splitmix64: a portable generator, so shuffles are the same on every platform.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void shuffle(std::vector<uint32_t>& v, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = v.size(); i > 1; --i) {
    // Unbiased bounded integer (Lemire's method without the rejection shortcut).
    const uint64_t bound = i;
    uint64_t x, r;
    do {
      x = splitmix64(state);
      r = x % bound;
    } while (x - r > UINT64_MAX - bound + 1);
    std::swap(v[i - 1], v[size_t(r)]);
  }
}

// {"input_ids"[, "labels"]}: the ids as given, checked against the vocabulary.
TokenizedExample ids_example(const json& j, const std::string& where, int32_t vocab) {
  TokenizedExample ex;
  ex.input_ids = parse_ids(j.at("input_ids"), where, "input_ids", vocab, false);
  if (j.contains("labels") && !j["labels"].is_null()) {
    ex.labels = parse_ids(j["labels"], where, "labels", vocab, true);
    if (ex.labels.size() != ex.input_ids.size())
      bad("labels length", where, "labels has " + std::to_string(ex.labels.size()) +
                                      " entries but input_ids has " +
                                      std::to_string(ex.input_ids.size()) +
                                      "; they must be the same length (not shifted)");
  } else {
    ex.labels = ex.input_ids;
  }
  return ex;
}

[[noreturn]] void unknown_format(const json& j, const std::string& where) {
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it)
    keys += (keys.empty() ? "" : ", ") + ("\"" + it.key() + "\"");
  bad("unknown format", where, "the object has keys {" + keys +
                                   "}; expected {\"text\"}, {\"prompt\",\"completion\"}, "
                                   "{\"messages\"} or {\"input_ids\"[,\"labels\"]}");
}

// A line that needs text tokenized when there is no tokenizer. Not a BadLineError: the line is
// fine, the model directory lacks a file, so --skip-bad-lines must not quietly drop such lines.
[[noreturn]] void no_tokenizer(const json& j, const std::string& where, const DatasetOptions& opt) {
  std::string kind;
  if (j.contains("messages")) kind = "a {\"messages\"}";
  else if (j.contains("prompt")) kind = "a {\"prompt\", \"completion\"}";
  else if (j.contains("text")) kind = "a {\"text\"}";
  else unknown_format(j, where);
  const std::string file =
      opt.tokenizer_file.empty() ? std::string("tokenizer.json") : opt.tokenizer_file.string();
  throw UserError(where + ": " + kind + " example needs the tokenizer, but " + file +
                  " is missing; copy the model's tokenizer.json (and tokenizer_config.json) "
                  "there, or give pre-tokenized {\"input_ids\"[, \"labels\"]} lines");
}

}  // namespace

TokenizedExample tokenize_line(std::string_view line, const std::string& where,
                               const Tokenizer* tokp, const ChatTemplate* chat,
                               const DatasetOptions& opt, std::string* format_name) {
  if (const size_t bad_at = utf8_first_invalid(line); bad_at != std::string_view::npos)
    bad("invalid UTF-8", where, "byte " + std::to_string(bad_at + 1) +
                                    " of the line is not valid UTF-8; save the file as UTF-8");
  if (line.find_first_not_of(" \t\r") == std::string_view::npos)
    bad("blank line", where, "the line is empty; expected one JSON object per line");
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number too large
    std::string msg = e.what();
    if (auto p = msg.find("parse error"); p != std::string::npos) msg = msg.substr(p);
    bad("invalid JSON", where, "not valid JSON (" + msg + "); expected one JSON object per line");
  }
  if (!j.is_object())
    bad("not an object", where, "the line is " + type_name(j) +
                                    "; expected a JSON object such as {\"text\": \"...\"}");
  auto set_format = [&](const char* f) {
    if (format_name) *format_name = f;
  };
  if (!tokp) {
    if (!j.contains("input_ids")) no_tokenizer(j, where, opt);
    if (opt.vocab_size <= 0)
      throw UserError(where + ": token ids without a tokenizer need the vocabulary size; set "
                              "vocab_size in the model's config.json");
    set_format("input_ids");
    TokenizedExample ex = ids_example(j, where, opt.vocab_size);
    if (ex.input_ids.empty()) bad("empty example", where, "the example has no tokens");
    ex.labels[0] = kIgnoreLabel;  // nothing predicts a document's first token
    return ex;
  }
  const Tokenizer& tok = *tokp;
  const int32_t vocab = opt.vocab_size > 0 ? opt.vocab_size : tok.vocab_size();
  TokenizedExample ex;
  const auto eos = tok.eos_id();
  // Plain text and prompt/completion start with BOS where tokenizer_config.json says
  // add_bos_token (Llama 2, Mistral), as transformers' tokenizer(text) does; chat templates
  // write their own BOS, and pre-tokenized ids are taken as they are.
  const std::optional<int32_t> bos =
      tok.config().add_bos_token ? tok.bos_id() : std::optional<int32_t>();
  if (j.contains("input_ids")) {
    set_format("input_ids");
    ex = ids_example(j, where, vocab);
  } else if (j.contains("messages") ||
             (j.contains("prompt") && j["prompt"].is_array() && j.contains("completion"))) {
    std::vector<ChatMessage> msgs;
    size_t prompt_count = 0;
    if (j.contains("messages")) {
      set_format("messages");
      msgs = parse_messages(j["messages"], where, "messages");
    } else {
      set_format("prompt/completion messages");
      msgs = parse_messages(j["prompt"], where, "prompt");
      prompt_count = msgs.size();
      auto done = parse_messages(j["completion"], where, "completion");
      msgs.insert(msgs.end(), done.begin(), done.end());
    }
    (void)prompt_count;
    if (!chat)
      throw UserError(where + ": a conversation, but " + tok.origin() +
                      " has no chat template forja recognises; choose one with --chat-template "
                      "NAME (" + known_templates() + ")");
    if (!opt.train_on_inputs &&
        std::none_of(msgs.begin(), msgs.end(), [](const ChatMessage& m) {
          return m.role == "assistant";
        }))
      bad("no assistant turn", where,
          "the conversation has no assistant message, so nothing would be learned from it");
    std::vector<ChatSegment> segs;
    try {
      segs = chat->render(msgs, opt.chat, tok.config().bos_token.value_or(""));
    } catch (const UserError& e) {  // roles the template refuses (Mistral: order, tool turns)
      bad("conversation the chat template refuses", where, e.what());
    }
    std::vector<std::string_view> parts;
    std::vector<bool> trainable;
    for (const auto& s : segs) {
      parts.push_back(s.text);
      trainable.push_back(s.trainable);
    }
    encode_labelled(tok, parts, trainable, opt.train_on_inputs, ex);
  } else if (j.contains("prompt") || j.contains("completion")) {
    set_format("prompt/completion");
    const std::string& prompt = get_string(j, "prompt", where, "\"prompt\"");
    const std::string& completion = get_string(j, "completion", where, "\"completion\"");
    if (bos) ex.input_ids.push_back(*bos);
    encode_labelled(tok, {prompt, completion}, {false, true}, opt.train_on_inputs, ex);
    if (opt.add_eos && eos) {
      ex.input_ids.push_back(*eos);
      ex.labels.push_back(*eos);
    }
  } else if (j.contains("text")) {
    set_format("text");
    const std::string& text = get_string(j, "text", where, "\"text\"");
    if (bos) ex.input_ids.push_back(*bos);
    tok.encode_append(text, ex.input_ids);
    if (opt.add_eos && eos) ex.input_ids.push_back(*eos);
    ex.labels = ex.input_ids;
  } else {
    unknown_format(j, where);
  }
  // A tokenizer.json with more tokens than the model's embedding (another model's tokenizer,
  // added tokens beyond vocab_size) would send ids past the embedding to the GPU (found by
  // fuzz/fuzz_dataset_line.cpp).
  if (opt.vocab_size > 0)
    for (size_t i = 0; i < ex.input_ids.size(); ++i)
      if (ex.input_ids[i] >= opt.vocab_size)
        bad("token id out of range", where,
            "token " + std::to_string(i) + " is id " + std::to_string(ex.input_ids[i]) + ", outside the model's " +
                "vocabulary (vocab_size " + std::to_string(opt.vocab_size) + " in config.json); " + tok.origin() +
                " does not belong to this model");
  if (ex.input_ids.empty()) bad("empty example", where, "the example has no tokens");
  ex.labels[0] = kIgnoreLabel;  // nothing predicts a document's first token
  return ex;
}

int64_t DatasetStats::skipped_total() const {
  int64_t n = 0;
  for (const auto& [k, v] : skipped) n += v;
  return n;
}

std::string DatasetStats::summary() const {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << path << ": " << examples << " examples from " << lines << " lines";
  for (const auto& [f, n] : formats) s << ", " << n << " " << f;
  s << "\n  tokens " << tokens << ", with loss " << loss_tokens << " ("
    << (tokens ? 100.0 * double(loss_tokens) / double(tokens) : 0.0) << "%)";
  s << "\n  truncated to seq_len: " << truncated << " examples, " << truncated_tokens
    << " tokens cut";
  if (without_loss) s << "; " << without_loss << " examples left without any loss token";
  if (!skipped.empty()) {
    s << "\n  skipped " << skipped_total() << " bad lines:";
    for (const auto& [k, v] : skipped) s << " " << k << " " << v << ";";
    for (const auto& m : skipped_examples) s << "\n    " << m;
  }
  return s.str();
}

// The file, its index, and (while they fit) its tokenized examples.
struct Dataset::Source {
  std::filesystem::path path;
  const Tokenizer* tokenizer = nullptr;
  std::optional<ChatTemplate> chat;
  DatasetOptions options;
  DatasetStats stats;
  bool all_text = true;
  // Per example (usable lines only):
  std::vector<uint64_t> offset;  // byte offset of the line
  std::vector<uint32_t> length;  // bytes of the line (without the newline)
  std::vector<uint32_t> line;    // 1-based line number
  std::vector<uint32_t> tokens;  // tokens after truncation
  std::vector<uint32_t> loss;    // loss tokens after truncation
  // Token cache: flat ids and labels; cache_at[i] = start of example i (size examples + 1).
  bool cached = false;
  std::vector<int32_t> cache_ids, cache_labels;
  std::vector<uint64_t> cache_at;
  int fd = -1;

  ~Source() {
    if (fd >= 0) ::close(fd);
  }
  std::string where(uint32_t line_no) const {
    return path.string() + ":" + std::to_string(line_no);
  }
  void truncate(TokenizedExample& ex) const {
    if (ex.input_ids.size() > size_t(options.seq_len)) {
      ex.input_ids.resize(size_t(options.seq_len));
      ex.labels.resize(size_t(options.seq_len));
    }
  }
  TokenizedExample example(uint32_t i) const {
    TokenizedExample ex;
    if (cached) {
      ex.input_ids.assign(cache_ids.begin() + ptrdiff_t(cache_at[i]),
                          cache_ids.begin() + ptrdiff_t(cache_at[i + 1]));
      ex.labels.assign(cache_labels.begin() + ptrdiff_t(cache_at[i]),
                       cache_labels.begin() + ptrdiff_t(cache_at[i + 1]));
      return ex;
    }
    std::string buf(length[i], '\0');
    size_t got = 0;
    while (got < buf.size()) {
      const ssize_t n = ::pread(fd, buf.data() + got, buf.size() - got, off_t(offset[i] + got));
      if (n <= 0)
        throw UserError(where(line[i]) + ": cannot re-read the line (file changed or removed "
                                         "during training?); keep the data file unchanged");
      got += size_t(n);
    }
    if (!buf.empty() && buf.back() == '\r') buf.pop_back();
    ex = tokenize_line(buf, where(line[i]), tokenizer, chat ? &*chat : nullptr, options);
    truncate(ex);
    return ex;
  }
  static std::shared_ptr<Source> open(const std::filesystem::path& file, const Tokenizer* tok,
                                      const DatasetOptions& opt);
};

std::shared_ptr<Dataset::Source> Dataset::Source::open(const std::filesystem::path& file,
                                                       const Tokenizer* tok,
                                                       const DatasetOptions& opt) {
  auto src = std::make_shared<Source>();
  src->path = file;
  src->tokenizer = tok;
  src->options = opt;
  src->stats.path = file.string();
  if (opt.seq_len < 2)
    throw UserError("seq_len " + std::to_string(opt.seq_len) + " is too small; use at least 2");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw UserError(file.string() + ": not found or not a file; give a JSONL data file");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UserError(file.string() + ": cannot open; check permissions");
  src->fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (src->fd < 0) throw UserError(file.string() + ": cannot open; check permissions");

  // The chat template is needed only if a conversation appears (tokenize_line then says how to
  // choose one when there is none); an unknown explicit name is an error at once.
  bool chat_tried = false;
  auto chat_for_line = [&]() -> const ChatTemplate* {
    if (!chat_tried && tok) {  // without a tokenizer only token ids are read (no template)
      chat_tried = true;
      try {
        src->chat = ChatTemplate::choose(opt.chat_template, tok->config());
      } catch (const UserError&) {
        if (!opt.chat_template.empty()) throw;
      }
    }
    return src->chat ? &*src->chat : nullptr;
  };

  DatasetStats& st = src->stats;
  std::string line;
  uint64_t offset = 0;
  uint32_t line_no = 0;
  const bool keep = opt.max_cached_tokens > 0;
  src->cached = keep;
  if (keep) src->cache_at.push_back(0);
  while (std::getline(in, line)) {
    ++line_no;
    uint64_t line_off = offset;
    offset += line.size() + 1;
    if (line_no == 1 && line.starts_with("\xEF\xBB\xBF")) {  // UTF-8 byte order mark
      line.erase(0, 3);
      line_off += 3;
    }
    const auto raw_len = uint32_t(line.size());  // what pread must read back
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // A file that ends without a final newline is fine; a blank last line is not an example.
    if (line.empty() && in.peek() == std::char_traits<char>::eof()) break;
    ++st.lines;
    std::string format;
    TokenizedExample ex;
    try {
      ex = tokenize_line(line, src->where(line_no), tok, chat_for_line(), opt, &format);
    } catch (const BadLineError& e) {
      if (!opt.skip_bad_lines) throw;
      ++st.skipped[e.kind()];
      if (st.skipped_examples.size() < 5) st.skipped_examples.push_back(e.what());
      continue;
    }
    ++st.formats[format];
    if (format != "text") src->all_text = false;
    const size_t full = ex.input_ids.size();
    if (full > size_t(opt.seq_len)) {
      ++st.truncated;
      st.truncated_tokens += int64_t(full - size_t(opt.seq_len));
      src->truncate(ex);
    }
    const auto loss = uint32_t(std::count_if(ex.labels.begin(), ex.labels.end(),
                                             [](int32_t l) { return l != kIgnoreLabel; }));
    if (loss == 0) ++st.without_loss;
    ++st.examples;
    st.tokens += int64_t(ex.input_ids.size());
    st.loss_tokens += loss;
    src->offset.push_back(line_off);
    src->length.push_back(raw_len);
    src->line.push_back(line_no);
    src->tokens.push_back(uint32_t(ex.input_ids.size()));
    src->loss.push_back(loss);
    if (src->cached) {
      if (int64_t(src->cache_ids.size() + ex.input_ids.size()) > opt.max_cached_tokens) {
        src->cached = false;  // too big: re-read lines on demand from now on
        std::vector<int32_t>().swap(src->cache_ids);
        std::vector<int32_t>().swap(src->cache_labels);
        std::vector<uint64_t>().swap(src->cache_at);
      } else {
        src->cache_ids.insert(src->cache_ids.end(), ex.input_ids.begin(), ex.input_ids.end());
        src->cache_labels.insert(src->cache_labels.end(), ex.labels.begin(), ex.labels.end());
        src->cache_at.push_back(src->cache_ids.size());
      }
    }
  }
  if (in.bad()) throw UserError(file.string() + ": read error after line " +
                                std::to_string(line_no) + "; check the file system");
  if (st.lines == 0)
    throw UserError(file.string() +
                    ": the file is empty; expected one JSON example per line (JSONL)");
  if (st.examples == 0)
    throw UserError(file.string() + ": all " + std::to_string(st.lines) +
                    " lines were bad and skipped; nothing to train on\n" + st.summary());
  return src;
}

struct Dataset::Plan {
  int64_t epoch = -1;
  std::vector<uint32_t> order;     // example indices (into the source) in row order
  std::vector<uint64_t> row_start; // rows: order[row_start[r] .. row_start[r+1])
};

Dataset::Dataset(std::shared_ptr<Source> src, std::vector<uint32_t> examples, bool shuffled)
    : src_(std::move(src)),
      examples_(std::move(examples)),
      shuffled_(shuffled),
      plan_mutex_(std::make_unique<std::mutex>()) {}
Dataset::Dataset(Dataset&&) noexcept = default;
Dataset& Dataset::operator=(Dataset&&) noexcept = default;
Dataset::~Dataset() = default;

Dataset::Split Dataset::load(const std::filesystem::path& file, const Tokenizer* tokenizer,
                             const DatasetOptions& options) {
  if (options.eval_split < 0.0 || options.eval_split >= 1.0)
    throw UserError("eval split " + std::to_string(options.eval_split) +
                    " is outside [0, 1); give a fraction such as 0.05");
  if (options.eval_split > 0.0 && !options.eval_file.empty())
    throw UserError("both an eval split and an eval file were given; choose one");
  auto src = Source::open(file, tokenizer, options);
  const auto n = uint32_t(src->offset.size());
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  const bool packing = options.packing.value_or(src->all_text);
  src->options.packing = packing;
  if (options.eval_split > 0.0) {
    auto held = static_cast<uint32_t>(std::llround(options.eval_split * n));
    held = std::max<uint32_t>(held, 1);
    if (held >= n)
      throw UserError(file.string() + ": an eval split of " + std::to_string(options.eval_split) +
                      " leaves no training examples out of " + std::to_string(n) +
                      "; lower --eval-split or add data");
    std::vector<uint32_t> perm = all;
    shuffle(perm, options.seed ^ 0xE7A1u);
    std::vector<uint32_t> eval(perm.begin(), perm.begin() + held);
    std::vector<uint32_t> train(perm.begin() + held, perm.end());
    std::sort(eval.begin(), eval.end());
    std::sort(train.begin(), train.end());
    return Split{Dataset(src, std::move(train), options.shuffle), Dataset(src, std::move(eval), false)};
  }
  Split split{Dataset(src, std::move(all), options.shuffle), std::nullopt};
  if (!options.eval_file.empty()) {
    DatasetOptions eo = options;
    eo.packing = packing;
    auto esrc = Source::open(options.eval_file, tokenizer, eo);
    std::vector<uint32_t> e(esrc->offset.size());
    std::iota(e.begin(), e.end(), 0u);
    split.eval = Dataset(esrc, std::move(e), false);
  }
  return split;
}

int64_t Dataset::num_examples() const { return int64_t(examples_.size()); }
int32_t Dataset::seq_len() const { return src_->options.seq_len; }
bool Dataset::packing() const { return src_->options.packing.value_or(false); }
const DatasetStats& Dataset::stats() const { return src_->stats; }
int64_t Dataset::tokens() const {
  int64_t n = 0;
  for (uint32_t i : examples_) n += src_->tokens[i];
  return n;
}
int64_t Dataset::loss_tokens() const {
  int64_t n = 0;
  for (uint32_t i : examples_) n += src_->loss[i];
  return n;
}
TokenizedExample Dataset::example(int64_t i) const { return src_->example(examples_.at(size_t(i))); }
int64_t Dataset::line_of(int64_t i) const { return src_->line.at(examples_.at(size_t(i))); }

std::shared_ptr<const Dataset::Plan> Dataset::plan(int64_t epoch) const {
  std::lock_guard lock(*plan_mutex_);
  if (plan_ && plan_->epoch == epoch) return plan_;
  auto p = std::make_shared<Plan>();
  p->epoch = epoch;
  p->order = examples_;
  if (shuffled_) shuffle(p->order, src_->options.seed * 0x100000001B3ull + uint64_t(epoch));
  const auto seq = uint64_t(src_->options.seq_len);
  p->row_start.push_back(0);
  if (packing()) {
    uint64_t used = 0;
    for (size_t k = 0; k < p->order.size(); ++k) {
      const uint64_t len = src_->tokens[p->order[k]];
      if (used > 0 && used + len > seq) {
        p->row_start.push_back(k);
        used = 0;
      }
      used += len;
    }
    if (!p->order.empty()) p->row_start.push_back(p->order.size());
  } else {
    for (size_t k = 1; k <= p->order.size(); ++k) p->row_start.push_back(k);
  }
  plan_ = p;
  return plan_;
}

int64_t Dataset::num_rows(int64_t epoch) const {
  return int64_t(plan(epoch)->row_start.size()) - 1;
}

int64_t Dataset::num_batches(int64_t epoch, int32_t batch_size) const {
  if (batch_size < 1) throw UserError("batch size must be at least 1");
  return (num_rows(epoch) + batch_size - 1) / batch_size;
}

Batch Dataset::batch(int64_t epoch, int64_t index, int32_t batch_size) const {
  if (batch_size < 1) throw UserError("batch size must be at least 1");
  const auto plan_ptr = plan(epoch);
  const Plan& p = *plan_ptr;
  const int32_t S = seq_len();
  // Padding is masked (label -100, segment 0), so without a tokenizer any valid id will do.
  const Tokenizer* tok = src_->tokenizer;
  const int32_t pad = tok ? tok->pad_id().value_or(tok->eos_id().value_or(0)) : 0;
  Batch b;
  b.batch_size = batch_size;
  b.seq_len = S;
  const size_t total = size_t(batch_size) * size_t(S);
  b.input_ids.assign(total, pad);
  b.labels.assign(total, kIgnoreLabel);
  b.position_ids.assign(total, 0);
  b.segment_ids.assign(total, 0);
  const int64_t rows = int64_t(p.row_start.size()) - 1;
  for (int32_t r = 0; r < batch_size; ++r) {
    const int64_t row = index * batch_size + r;
    if (row < 0 || row >= rows) continue;
    ++b.rows;
    size_t col = 0;
    int32_t segment = 0;
    for (uint64_t k = p.row_start[size_t(row)]; k < p.row_start[size_t(row) + 1]; ++k) {
      const TokenizedExample ex = src_->example(p.order[k]);
      ++segment;
      ++b.documents;
      const size_t base = size_t(r) * size_t(S);
      for (size_t t = 0; t < ex.input_ids.size() && col < size_t(S); ++t, ++col) {
        b.input_ids[base + col] = ex.input_ids[t];
        b.labels[base + col] = ex.labels[t];
        b.position_ids[base + col] = int32_t(t);
        b.segment_ids[base + col] = segment;
        ++b.tokens;
        if (ex.labels[t] != kIgnoreLabel) ++b.loss_tokens;
      }
    }
  }
  return b;
}

}  // namespace forja::data
