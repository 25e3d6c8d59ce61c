// BPE from tokenizer.json, byte-level or SentencePiece-style; see tokenizer.h for the pipelines
// and docs/formats.md 5.1 and 5.4.
#include "data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "data/utf8.h"
#include "util/error.h"

namespace forja::data {
namespace {

using nlohmann::json;

// Hash for heterogeneous lookup of std::string keys by std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// The value of an integer field, nullopt for anything else: nlohmann's get<int64_t>() of a float
// casts it, which is undefined beyond the integer's range (an id of 2.5e35 was found by
// fuzz/fuzz_tokenizer_json.cpp).
std::optional<int64_t> json_integer(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > uint64_t(INT64_MAX) ? std::nullopt : std::optional<int64_t>(int64_t(u));
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

// Ids at or beyond this are refused, as config.json's vocab_size is (model/config.cpp): the tables
// indexed by id would otherwise take gigabytes for one stray id (a vocabulary id of about 2^30 ran
// the tokenizer_json fuzzer out of memory).
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100 onwards.
std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> map{};
  std::array<bool, 256> direct{};
  for (int b = 0x21; b <= 0x7E; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? char32_t(b) : next++;
  return map;
}

// Open-addressing map from a pair of token ids to (merge rank, merged id).
class PairMap {
 public:
  struct Entry {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  void build(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Entry{kEmpty, 0, 0});
    mask_ = cap - 1;
  }
  // Later entries overwrite earlier ones, as the `tokenizers` HashMap built from merges does.
  void put(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t key = make_key(a, b);
    size_t i = slot(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    slots_[i] = Entry{key, rank, merged};
  }
  const Entry* find(int32_t a, int32_t b) const {
    const uint64_t key = make_key(a, b);
    size_t i = slot(key);
    while (true) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t make_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

struct Pcre2CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct Pcre2MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

// GPT-2's pattern, used by ByteLevel when its use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool is_word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c >= 0x80;
}

// The SentencePiece word marker "▁" (U+2581).
constexpr std::string_view kMetaspace = "\xE2\x96\x81";

// s with every occurrence of `from` (not empty) replaced by `to`.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t at = 0;
  for (size_t p; (p = s.find(from, at)) != std::string_view::npos; at = p + from.size()) {
    out.append(s.substr(at, p - at));
    out.append(to);
  }
  out.append(s.substr(at));
  return out;
}

// One step of a SentencePiece-style decoder (tokenizers' decoders/*.rs), applied in order to
// the list of token strings; the results are concatenated at the end.
struct DecodeStep {
  enum class Kind { replace, byte_fallback, fuse, strip, metaspace } kind;
  std::string from, to;        // replace: literal pattern and content; metaspace: replacement
  char32_t strip_char = 0;     // strip: the character, at most `start` on the left, `stop` on
  size_t start = 0, stop = 0;  // the right, of each string
  bool metaspace_prepends = false;  // metaspace: prepend_scheme is not "never"
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path.string() + ": cannot open the file; check the path and permissions");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  TokenizerConfig config;

  // Vocabulary.
  StringMap<int32_t> vocab;               // model.vocab, mapped alphabet
  std::vector<std::string> id_to_token;   // [vocab_size]: vocab string or added content
  std::vector<std::string> id_to_bytes;   // [vocab_size]: what decode emits for the id
  std::vector<uint8_t> id_flags;          // [vocab_size]: 1 used, 2 added, 4 special
  int32_t vocab_size = 0;
  std::array<int32_t, 256> byte_id{};     // id of each byte's single symbol
  std::array<std::string, 256> byte_str;  // each byte's symbol as UTF-8
  PairMap merges;
  bool ignore_merges = false;

  // Added tokens, matched leftmost-longest on the raw text.
  std::vector<AddedToken> added;
  StringMap<size_t> added_by_content;
  std::array<bool, 256> added_first_byte{};
  std::vector<size_t> added_lengths;  // distinct content lengths, longest first

  bool nfc = false;
  bool prefix_space = false;  // ByteLevel add_prefix_space (only with its own regex)
  std::unique_ptr<pcre2_code, Pcre2CodeDeleter> regex;

  // SentencePiece-style files (no ByteLevel step): the text is kept as UTF-8 characters.
  bool sentencepiece = false;
  struct NormStep {
    bool prepend;  // Prepend(to) if true, else Replace(from -> to)
    std::string from, to;
  };
  std::vector<NormStep> sp_normalizer;  // Prepend/Replace steps, in order
  enum class Prepend { never, first, always };
  bool metaspace = false;  // pre_tokenizer Metaspace
  std::string metaspace_replacement;
  Prepend metaspace_prepend = Prepend::never;
  bool metaspace_split = false;
  bool byte_fallback = false;
  std::array<int32_t, 256> fallback_id{};  // id of "<0xNN>" per byte, -1 if absent
  int32_t unk_id = -1;                     // model.unk_token, -1 if none
  bool fuse_unk = false;
  std::vector<uint32_t> norm_len;  // [vocab_size]: normalised bytes a BPE token covers
  std::vector<DecodeStep> decoder;
  bool has_decoder = false;  // no decoder: HF joins the token strings with spaces

  // Piece -> ids cache (ids stored in one arena).
  mutable std::mutex cache_mutex;
  mutable StringMap<std::pair<uint32_t, uint32_t>> cache;
  mutable std::vector<int32_t> cache_ids;

  void parse(const json& j);
  void parse_pre_tokenizer(const json& p);
  void parse_sp_normalizer(const json& n);
  void parse_metaspace(const json& p);
  void parse_sp_decoder(const json& d);
  void parse_sp_vocab(const json& model);
  void parse_byte_vocab();
  void parse_merges(const json& model);
  void compile_regex(const std::string& pattern);
  // Optional tracking of where each token starts in the caller's text (encode_parts).
  struct Track {
    std::vector<uint32_t>* starts;     // out: raw byte offset of each token's first byte
    const std::vector<size_t>* cuts;  // raw offsets where a new part begins (sorted)
  };
  void encode_text(std::string_view text, std::vector<int32_t>& out, Track* track) const;
  void encode_segment(std::string_view text, size_t raw_base, std::vector<int32_t>& out,
                      pcre2_match_data* md, Track* track) const;
  void emit_piece(std::string_view piece, size_t start, std::vector<int32_t>& out,
                  Track* track, const std::vector<std::pair<size_t, size_t>>* map) const;
  void encode_segment_sp(std::string_view text, size_t raw_base, std::vector<int32_t>& out,
                         Track* track) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void sp_word(std::string_view piece, std::vector<int32_t>& out,
               std::vector<uint32_t>* lens) const;
  size_t merge_all(int32_t* ids, uint32_t* lens, size_t n) const;
  std::string decode_sp(std::span<const int32_t> ids, bool skip_special) const;
  std::string where(const std::string& field) const { return origin + ": " + field; }
};

void Tokenizer::Impl::compile_regex(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw UserError(where("pre_tokenizer Split pattern") + ": the regex does not compile at offset " +
                    std::to_string(off) + " (" + reinterpret_cast<char*>(msg) +
                    "); this tokenizer.json is not supported");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  regex.reset(code);
}

void Tokenizer::Impl::parse_pre_tokenizer(const json& p) {
  const std::string fix =
      "; forja supports byte-level BPE tokenizers whose pre_tokenizer is ByteLevel or "
      "Sequence[Split(Regex, Isolated), ByteLevel] (Qwen2/2.5/3, Llama 3)";
  if (!p.is_object()) throw UserError(where("pre_tokenizer") + ": missing" + fix);
  const std::string type = p.value("type", "");
  std::vector<json> steps;
  if (type == "Sequence") {
    for (const auto& s : p.at("pretokenizers")) steps.push_back(s);
  } else {
    steps.push_back(p);
  }
  bool byte_level = false;
  std::string pattern;
  for (const auto& s : steps) {
    const std::string t = s.value("type", "");
    if (t == "Split") {
      if (!pattern.empty() || byte_level)
        throw UserError(where("pre_tokenizer") + ": more than one splitting step" + fix);
      if (s.value("behavior", "") != "Isolated" || s.value("invert", false))
        throw UserError(where("pre_tokenizer Split") + ": behavior must be Isolated, invert false" +
                        fix);
      const json& pat = s.at("pattern");
      if (pat.contains("Regex")) {
        pattern = pat.at("Regex").get<std::string>();
      } else if (pat.contains("String")) {
        pattern = "\\Q" + pat.at("String").get<std::string>() + "\\E";
      } else {
        throw UserError(where("pre_tokenizer Split pattern") + ": neither Regex nor String" + fix);
      }
    } else if (t == "ByteLevel") {
      byte_level = true;
      if (s.value("use_regex", true)) {
        if (!pattern.empty())
          throw UserError(where("pre_tokenizer ByteLevel") + ": use_regex after a Split" + fix);
        pattern = kGpt2Pattern;
        prefix_space = s.value("add_prefix_space", false);
      } else if (s.value("add_prefix_space", false)) {
        throw UserError(where("pre_tokenizer ByteLevel") + ": add_prefix_space without use_regex" +
                        fix);
      }
    } else {
      throw UserError(where("pre_tokenizer") + ": step type \"" + t + "\" is not supported" + fix);
    }
  }
  if (!byte_level) throw UserError(where("pre_tokenizer") + ": no ByteLevel step" + fix);
  if (pattern.empty()) throw UserError(where("pre_tokenizer") + ": no splitting regex" + fix);
  compile_regex(pattern);
}

namespace {
// Whether a pre_tokenizer has a ByteLevel step: that decides between the two families.
bool has_byte_level(const json& p) {
  if (!p.is_object()) return false;
  if (p.value("type", "") == "ByteLevel") return true;
  if (p.value("type", "") == "Sequence" && p.contains("pretokenizers"))
    for (const auto& s : p.at("pretokenizers"))
      if (s.is_object() && s.value("type", "") == "ByteLevel") return true;
  return false;
}

const char* kSpFix =
    "; forja supports SentencePiece-style BPE files whose normalizer is null or "
    "Sequence[Prepend(\"\u2581\"), Replace(\" \", \"\u2581\")] and whose pre_tokenizer is null or "
    "Metaspace (Llama 2, Mistral v0.1-v0.3), and byte-level BPE files (Qwen, Llama 3)";
}  // namespace

void Tokenizer::Impl::parse_sp_normalizer(const json& n) {
  if (n.is_null()) return;
  if (!n.is_object()) throw UserError(where("normalizer") + ": expected an object or null");
  const std::string t = n.value("type", "");
  if (t == "Sequence") {
    for (const auto& s : n.at("normalizers")) parse_sp_normalizer(s);
  } else if (t == "Prepend") {
    sp_normalizer.push_back({true, "", n.at("prepend").get<std::string>()});
  } else if (t == "Replace") {
    const json& pat = n.at("pattern");
    if (!pat.contains("String") || pat.at("String").get<std::string>().empty())
      throw UserError(where("normalizer Replace") +
                      ": only a non-empty String pattern is supported" + kSpFix);
    sp_normalizer.push_back({false, pat.at("String").get<std::string>(),
                             n.at("content").get<std::string>()});
  } else {
    throw UserError(where("normalizer") + ": type \"" + t + "\" is not supported with a " +
                    "SentencePiece-style (non-ByteLevel) pre_tokenizer" + kSpFix);
  }
}

void Tokenizer::Impl::parse_metaspace(const json& p) {
  if (p.is_null()) return;  // the legacy Llama form: the normalizer does the work
  const json* m = &p;
  if (p.is_object() && p.value("type", "") == "Sequence" && p.at("pretokenizers").size() == 1)
    m = &p.at("pretokenizers")[0];
  if (!m->is_object() || m->value("type", "") != "Metaspace")
    throw UserError(where("pre_tokenizer") + ": type \"" +
                    (m->is_object() ? m->value("type", "") : std::string("?")) +
                    "\" is not supported" + kSpFix);
  metaspace = true;
  metaspace_replacement = m->value("replacement", std::string(kMetaspace));
  if (utf8_sequence_length(metaspace_replacement, 0) != metaspace_replacement.size())
    throw UserError(where("pre_tokenizer Metaspace replacement") + ": must be one character");
  metaspace_split = m->value("split", true);
  if (m->contains("prepend_scheme")) {
    const std::string ps = m->at("prepend_scheme").get<std::string>();
    if (ps == "first") {
      metaspace_prepend = Prepend::first;
    } else if (ps == "always") {
      metaspace_prepend = Prepend::always;
    } else if (ps == "never") {
      metaspace_prepend = Prepend::never;
    } else {
      throw UserError(where("pre_tokenizer Metaspace prepend_scheme") + ": \"" + ps +
                      "\" is not one of first, always, never");
    }
  } else {  // tokenizers < 0.19 wrote add_prefix_space instead
    metaspace_prepend = m->value("add_prefix_space", true) ? Prepend::always : Prepend::never;
  }
}

void Tokenizer::Impl::parse_sp_decoder(const json& d) {
  if (d.is_null()) return;
  has_decoder = true;
  const std::string t = d.value("type", "");
  const std::string fix =
      "; forja decodes SentencePiece-style files with Sequence[Replace, ByteFallback, Fuse, "
      "Strip] or Metaspace decoders";
  DecodeStep step{};
  if (t == "Sequence") {
    for (const auto& s : d.at("decoders")) parse_sp_decoder(s);
    return;
  } else if (t == "Replace") {
    const json& pat = d.at("pattern");
    if (!pat.contains("String") || pat.at("String").get<std::string>().empty())
      throw UserError(where("decoder Replace") + ": only a non-empty String pattern is supported" +
                      fix);
    step.kind = DecodeStep::Kind::replace;
    step.from = pat.at("String").get<std::string>();
    step.to = d.at("content").get<std::string>();
  } else if (t == "ByteFallback") {
    step.kind = DecodeStep::Kind::byte_fallback;
  } else if (t == "Fuse") {
    step.kind = DecodeStep::Kind::fuse;
  } else if (t == "Strip") {
    step.kind = DecodeStep::Kind::strip;
    const std::string c = d.at("content").get<std::string>();
    if (c.empty() || utf8_sequence_length(c, 0) != c.size())
      throw UserError(where("decoder Strip content") + ": must be one character");
    utf8proc_int32_t cp = 0;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(c.data()),
                     utf8proc_ssize_t(c.size()), &cp);
    step.strip_char = char32_t(cp);
    for (auto [key, field] : {std::pair{"start", &step.start}, std::pair{"stop", &step.stop}}) {
      if (!d.contains(key)) continue;
      const auto n = json_integer(d.at(key));
      if (!n || *n < 0 || *n > 1000000)
        throw UserError(where("decoder Strip") + ": " + key + " must be a count of characters");
      *field = size_t(*n);
    }
  } else if (t == "Metaspace") {
    step.kind = DecodeStep::Kind::metaspace;
    step.from = d.value("replacement", std::string(kMetaspace));
    if (d.contains("prepend_scheme"))
      step.metaspace_prepends = d.at("prepend_scheme").get<std::string>() != "never";
    else
      step.metaspace_prepends = d.value("add_prefix_space", true);
  } else {
    throw UserError(where("decoder") + ": type \"" + t + "\" is not supported" + fix);
  }
  decoder.push_back(std::move(step));
}

void Tokenizer::Impl::parse(const json& j) {
  if (!j.is_object()) throw UserError(origin + ": not a JSON object; expected a tokenizer.json");
  const json& pre = j.contains("pre_tokenizer") ? j.at("pre_tokenizer") : json();
  sentencepiece = !has_byte_level(pre);
  // Normalizer: none or NFC (byte-level), Prepend/Replace (SentencePiece-style).
  const json& norm = j.contains("normalizer") ? j.at("normalizer") : json();
  if (sentencepiece) {
    parse_sp_normalizer(norm);
    parse_metaspace(pre);
    parse_sp_decoder(j.contains("decoder") ? j.at("decoder") : json());
  } else if (norm.is_object()) {
    const std::string t = norm.value("type", "");
    if (t == "NFC") {
      nfc = true;
    } else if (t == "Sequence" && norm.at("normalizers").empty()) {
    } else if (t == "Sequence" && norm.at("normalizers").size() == 1 &&
               norm.at("normalizers")[0].value("type", "") == "NFC") {
      nfc = true;
    } else {
      throw UserError(where("normalizer") + ": type \"" + t +
                      "\" is not supported; forja supports none or NFC");
    }
  } else if (!norm.is_null()) {
    throw UserError(where("normalizer") + ": expected an object or null");
  }
  if (!sentencepiece) parse_pre_tokenizer(pre);

  const json& model = j.at("model");
  if (model.value("type", "BPE") != "BPE")
    throw UserError(where("model.type") + ": \"" + model.value("type", "") +
                    "\" is not supported; forja reads BPE tokenizers only (byte-level or "
                    "SentencePiece-style with byte fallback)");
  auto empty_or_null = [&](const char* key) {
    return !model.contains(key) || model.at(key).is_null() ||
           (model.at(key).is_string() && model.at(key).get<std::string>().empty());
  };
  if (!empty_or_null("continuing_subword_prefix") || !empty_or_null("end_of_word_suffix"))
    throw UserError(where("model") +
                    ": continuing_subword_prefix/end_of_word_suffix are not supported");
  byte_fallback = model.value("byte_fallback", false);
  if (byte_fallback && !sentencepiece)
    throw UserError(where("model.byte_fallback") +
                    ": true together with a ByteLevel pre_tokenizer is not supported (a byte-level "
                    "vocabulary needs no fallback)");
  fuse_unk = model.value("fuse_unk", false);
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      model.at("dropout").get<double>() != 0.0)
    throw UserError(where("model.dropout") + ": BPE dropout is not supported; set it to null");
  ignore_merges = model.value("ignore_merges", false);

  // Vocabulary.
  const json& v = model.at("vocab");
  if (!v.is_object() || v.empty()) throw UserError(where("model.vocab") + ": missing or empty");
  vocab.reserve(v.size() * 2);
  int32_t max_id = -1;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const auto n = json_integer(it.value());
    if (!n || *n < 0 || *n > kMaxTokenId)
      throw UserError(where("model.vocab") + ": id " + it.value().dump() + " of \"" + it.key() +
                      "\" is not an id (an integer from 0 below 2^24)");
    const int64_t id = *n;
    vocab.emplace(it.key(), int32_t(id));
    max_id = std::max(max_id, int32_t(id));
  }
  const json& added_json = j.contains("added_tokens") ? j.at("added_tokens") : json::array();
  for (const auto& a : added_json) {
    AddedToken t;
    const auto n = json_integer(a.at("id"));
    if (!n || *n < 0 || *n > kMaxTokenId)
      throw UserError(where("added_tokens") + ": id " + a.at("id").dump() + " is not an id (an integer from 0 below 2^24)");
    t.id = int32_t(*n);
    t.content = a.at("content").get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    t.normalized = a.value("normalized", false);
    if (t.content.empty())  // (the id was checked above)
      throw UserError(where("added_tokens") + ": entry with id " + std::to_string(t.id) + " has empty content");
    max_id = std::max(max_id, t.id);
    added.push_back(std::move(t));
  }
  // Real vocabularies number their tokens densely (Qwen3: 151,669 tokens, ids 0..151668). Tables
  // here are indexed by id, so a few tokens with ids in the millions would take hundreds of
  // megabytes (the tokenizer_json fuzzer's slowest inputs): a file whose ids run far beyond its
  // token count is refused as damaged.
  const int64_t tokens = int64_t(vocab.size() + added.size());
  if (int64_t(max_id) >= 2 * tokens + 1024)
    throw UserError(where("model.vocab") + ": ids run up to " + std::to_string(max_id) + " for " +
                    std::to_string(tokens) + " tokens; a tokenizer numbers its tokens from 0 without large gaps "
                    "(the file looks damaged)");
  vocab_size = max_id + 1;
  id_to_token.assign(size_t(vocab_size), std::string());
  id_flags.assign(size_t(vocab_size), 0);
  for (const auto& [tok, id] : vocab) {
    id_to_token[size_t(id)] = tok;
    id_flags[size_t(id)] |= 1;
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    id_to_token[size_t(t.id)] = t.content;
    id_flags[size_t(t.id)] |= 1 | 2 | (t.special ? 4 : 0);
    added_by_content[t.content] = i;
    added_first_byte[uint8_t(t.content[0])] = true;
    if (std::find(added_lengths.begin(), added_lengths.end(), t.content.size()) ==
        added_lengths.end())
      added_lengths.push_back(t.content.size());
  }
  std::sort(added_lengths.rbegin(), added_lengths.rend());
  if (sentencepiece) {
    // Added tokens marked normalized are matched by tokenizers on the normalised text, after
    // Prepend/Replace have run over the whole segment; forja matches on the raw text only.
    if (!sp_normalizer.empty())
      for (const auto& t : added)
        if (t.normalized)
          throw UserError(where("added_tokens") + ": \"" + t.content +
                          "\" has normalized: true, which forja does not support together with "
                          "a Prepend/Replace normalizer; set it to false");
    parse_sp_vocab(model);
  } else {
    parse_byte_vocab();
  }
  parse_merges(model);
}

void Tokenizer::Impl::parse_sp_vocab(const json& model) {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = vocab.find(std::string_view(name));
    fallback_id[size_t(b)] = it == vocab.end() ? -1 : it->second;
  }
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    const std::string unk = model.at("unk_token").get<std::string>();
    auto it = vocab.find(unk);
    if (it == vocab.end())
      throw UserError(where("model.unk_token") + ": \"" + unk + "\" is not in model.vocab");
    unk_id = it->second;
  }
  // A token covers its string's bytes of normalised text; a byte-fallback token one byte.
  norm_len.assign(size_t(vocab_size), 0);
  for (int32_t id = 0; id < vocab_size; ++id)
    norm_len[size_t(id)] = uint32_t(id_to_token[size_t(id)].size());
  for (int32_t id : fallback_id)
    if (id >= 0) norm_len[size_t(id)] = 1;
}

void Tokenizer::Impl::parse_byte_vocab() {
  // Byte alphabet.
  const auto b2u = bytes_to_unicode();
  std::unordered_map<char32_t, uint8_t> u2b;
  for (int b = 0; b < 256; ++b) {
    byte_str[b].clear();
    utf8_append(byte_str[b], b2u[b]);
    u2b[b2u[b]] = uint8_t(b);
    auto it = vocab.find(byte_str[b]);
    if (it == vocab.end())
      throw UserError(where("model.vocab") + ": the byte symbol \"" + byte_str[b] + "\" (byte " +
                      std::to_string(b) + ") is missing; not a byte-level BPE vocabulary");
    byte_id[b] = it->second;
  }

  // What decode emits per id: the ByteLevel decoder maps each character back to its byte; a
  // token holding a character outside the byte alphabet is emitted as its raw UTF-8 instead.
  id_to_bytes.assign(size_t(vocab_size), std::string());
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string& s = id_to_token[size_t(id)];
    std::string bytes;
    bool all_mapped = true;
    for (size_t i = 0; i < s.size();) {
      utf8proc_int32_t cp = 0;
      const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                      utf8proc_ssize_t(s.size() - i), &cp);
      if (n <= 0) {
        all_mapped = false;
        break;
      }
      auto it = u2b.find(char32_t(cp));
      if (it == u2b.end()) {
        all_mapped = false;
        break;
      }
      bytes.push_back(char(it->second));
      i += size_t(n);
    }
    id_to_bytes[size_t(id)] = all_mapped ? bytes : s;
  }
}

void Tokenizer::Impl::parse_merges(const json& model) {
  // Merges, in either serialisation: "a b" (tokenizers < 0.20) or ["a", "b"].
  const json& m = model.at("merges");
  if (!m.is_array()) throw UserError(where("model.merges") + ": expected an array");
  merges.build(m.size());
  std::string a, b;
  for (size_t rank = 0; rank < m.size(); ++rank) {
    const json& e = m[rank];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw UserError(where("model.merges[" + std::to_string(rank) + "]") + ": \"" + s +
                        "\" is not two symbols separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw UserError(where("model.merges[" + std::to_string(rank) + "]") +
                      ": expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || im == vocab.end())
      throw UserError(where("model.merges[" + std::to_string(rank) + "]") + ": \"" + a + "\" + \"" +
                      b + "\" uses a symbol missing from model.vocab");
    merges.put(ia->second, ib->second, int32_t(rank), im->second);
  }
}

// The merge loop shared by both families (tokenizers' Word::merge_all): repeatedly merge the
// adjacent pair of lowest rank, leftmost on ties, until no pair is in the merge table. ids[0..n)
// are the symbols; the result is written back to ids[0..return value). lens (may be null) holds
// each symbol's length in normalised bytes and is merged alongside.
size_t Tokenizer::Impl::merge_all(int32_t* ids, uint32_t* lens, size_t n) const {
  if (n < 2) return n;
  constexpr int32_t kNone = INT32_MAX;
  if (n <= 128) {
    // Short words: keep the rank of each adjacent pair, merge the lowest (leftmost on ties).
    int32_t ranks[128], merged[128];
    size_t len = n;
    auto rank_at = [&](size_t i) {
      const PairMap::Entry* e = merges.find(ids[i], ids[i + 1]);
      ranks[i] = e ? e->rank : kNone;
      merged[i] = e ? e->merged : -1;
    };
    for (size_t i = 0; i + 1 < len; ++i) rank_at(i);
    while (len > 1) {
      size_t best = 0;
      int32_t best_rank = kNone;
      for (size_t i = 0; i + 1 < len; ++i)
        if (ranks[i] < best_rank) best_rank = ranks[i], best = i;
      if (best_rank == kNone) break;
      ids[best] = merged[best];
      if (lens) lens[best] += lens[best + 1];
      for (size_t i = best + 1; i + 1 < len; ++i) {
        ids[i] = ids[i + 1];
        if (lens) lens[i] = lens[i + 1];
        ranks[i] = ranks[i + 1];
        merged[i] = merged[i + 1];
      }
      --len;
      if (best > 0) rank_at(best - 1);
      if (best + 1 < len) rank_at(best);
    }
    return len;
  }
  // Long words: a heap of candidate merges over a linked list of symbols, O(n log n).
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Sym> sym(n);
  for (size_t i = 0; i < n; ++i)
    sym[i] = Sym{ids[i], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1, true};
  struct Cand {
    int32_t rank, pos, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    const int32_t nx = sym[size_t(pos)].next;
    if (nx < 0) return;
    if (const PairMap::Entry* e = merges.find(sym[size_t(pos)].id, sym[size_t(nx)].id))
      heap.push(Cand{e->rank, pos, e->merged});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& s = sym[size_t(c.pos)];
    if (!s.alive || s.next < 0) continue;
    Sym& nx = sym[size_t(s.next)];
    const PairMap::Entry* e = merges.find(s.id, nx.id);
    if (!e || e->merged != c.merged || e->rank != c.rank) continue;  // stale candidate
    s.id = c.merged;
    if (lens) lens[size_t(c.pos)] += lens[size_t(s.next)];
    nx.alive = false;
    s.next = nx.next;
    if (s.next >= 0) sym[size_t(s.next)].prev = c.pos;
    if (s.prev >= 0) push(s.prev);
    push(c.pos);
  }
  size_t len = 0;
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) {
    ids[len] = sym[size_t(i)].id;
    if (lens) lens[len] = lens[size_t(i)];  // len <= i: compacting forwards is safe
    ++len;
  }
  return len;
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  if (n <= 128) {
    int32_t ids[128];
    for (size_t i = 0; i < n; ++i) ids[i] = byte_id[uint8_t(piece[i])];
    out.insert(out.end(), ids, ids + merge_all(ids, nullptr, n));
    return;
  }
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = byte_id[uint8_t(piece[i])];
  ids.resize(merge_all(ids.data(), nullptr, n));
  out.insert(out.end(), ids.begin(), ids.end());
}

// SentencePiece-style word (tokenizers' BPE::merge_word): each character is its vocabulary id;
// one that is not in the vocabulary becomes its bytes' <0xNN> tokens when byte_fallback is on
// and all of them exist, else <unk> (consecutive ones fused into one with fuse_unk). As in
// tokenizers, a pending <unk> is only flushed by the next in-vocabulary character, so byte
// tokens that follow it come first (only files lacking some <0xNN> tokens can show this).
void Tokenizer::Impl::sp_word(std::string_view piece, std::vector<int32_t>& out,
                              std::vector<uint32_t>* lens_out) const {
  std::vector<int32_t> ids;
  std::vector<uint32_t> lens;
  ids.reserve(piece.size());
  lens.reserve(piece.size());
  int32_t unk_len = 0;  // > 0: an <unk> of that many bytes is pending
  auto flush_unk = [&] {
    if (unk_len > 0) {
      ids.push_back(unk_id);
      lens.push_back(uint32_t(unk_len));
      unk_len = 0;
    }
  };
  for (size_t i = 0; i < piece.size();) {
    const size_t n = std::max<size_t>(1, utf8_sequence_length(piece, i));
    const std::string_view ch = piece.substr(i, n);
    i += n;
    if (auto it = vocab.find(ch); it != vocab.end()) {
      flush_unk();
      ids.push_back(it->second);
      lens.push_back(uint32_t(n));
      continue;
    }
    if (byte_fallback &&
        std::all_of(ch.begin(), ch.end(), [&](char c) { return fallback_id[uint8_t(c)] >= 0; })) {
      for (char c : ch) {
        ids.push_back(fallback_id[uint8_t(c)]);
        lens.push_back(1);
      }
      continue;
    }
    if (unk_id < 0)
      throw UserError(origin + ": the character \"" + std::string(ch) +
                      "\" is not in the vocabulary and the file has neither byte_fallback tokens "
                      "for it nor an unk_token; this tokenizer.json cannot encode the text");
    if (unk_len > 0 && !fuse_unk) flush_unk();
    unk_len += int32_t(n);
  }
  flush_unk();
  const size_t len = merge_all(ids.data(), lens.data(), ids.size());
  out.insert(out.end(), ids.begin(), ids.begin() + ptrdiff_t(len));
  if (lens_out) lens_out->insert(lens_out->end(), lens.begin(), lens.begin() + ptrdiff_t(len));
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  constexpr size_t kMaxCached = 64;
  const bool cacheable = piece.size() <= kMaxCached;
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), cache_ids.begin() + it->second.first,
                 cache_ids.begin() + it->second.first + it->second.second);
      return;
    }
  }
  const size_t start = out.size();
  bool done = false;
  if (ignore_merges) {
    std::string mapped;
    if (!sentencepiece) {
      mapped.reserve(piece.size() * 2);
      for (char c : piece) mapped += byte_str[uint8_t(c)];
    }
    auto it = vocab.find(sentencepiece ? piece : std::string_view(mapped));
    if (it != vocab.end()) {
      out.push_back(it->second);
      done = true;
    }
  }
  if (!done) {
    if (sentencepiece)
      sp_word(piece, out, nullptr);
    else
      bpe(piece, out);
  }
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (cache.size() >= (1u << 20) || cache_ids.size() >= (1u << 24)) {
      cache.clear();
      cache_ids.clear();
    }
    const auto off = uint32_t(cache_ids.size());
    cache_ids.insert(cache_ids.end(), out.begin() + ptrdiff_t(start), out.end());
    cache.emplace(std::string(piece), std::make_pair(off, uint32_t(out.size() - start)));
  }
}

void Tokenizer::Impl::emit_piece(std::string_view piece, size_t start,
                                 std::vector<int32_t>& out, Track* track,
                                 const std::vector<std::pair<size_t, size_t>>* map) const {
  const size_t first = out.size();
  encode_piece(piece, out);
  if (!track) return;
  // Each token's bytes are consecutive in the piece; map normalised offsets back to raw ones
  // through the (normalised start, raw start) list of sub-segments when NFC changed the text.
  size_t off = start;
  for (size_t k = first; k < out.size(); ++k) {
    size_t raw = off;
    if (map) {
      auto it = std::upper_bound(map->begin(), map->end(), std::make_pair(off, SIZE_MAX));
      --it;
      raw = it->second + (off - it->first);
      if (it + 1 != map->end()) raw = std::min(raw, (it + 1)->second - 1);
    }
    track->starts->push_back(uint32_t(raw));
    off += id_to_bytes[size_t(out[k])].size();
  }
}

void Tokenizer::Impl::encode_segment(std::string_view text, size_t raw_base,
                                     std::vector<int32_t>& out, pcre2_match_data* md,
                                     Track* track) const {
  if (text.empty()) return;
  // NFC. Text whose code points are all below U+0300 (no lead byte >= 0xCC) is already NFC.
  std::string normalized;
  std::vector<std::pair<size_t, size_t>> offset_map;  // (normalised offset, raw offset)
  bool changed = false;
  if (nfc) {
    bool may_change = false;
    for (char c : text)
      if (uint8_t(c) >= 0xCC) {
        may_change = true;
        break;
      }
    if (may_change) {
      // With tracking, each part is normalised on its own so that tokens keep their part.
      std::vector<size_t> subs = {0};
      if (track)
        for (size_t c : *track->cuts)
          if (c > raw_base && c < raw_base + text.size()) subs.push_back(c - raw_base);
      subs.push_back(text.size());
      for (size_t k = 0; k + 1 < subs.size(); ++k) {
        const std::string_view sub = text.substr(subs[k], subs[k + 1] - subs[k]);
        utf8proc_uint8_t* buf = nullptr;
        const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(sub.data()),
                                      utf8proc_ssize_t(sub.size()), &buf,
                                      utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        if (len < 0) throw UserError(origin + ": NFC normalisation failed: " +
                                     utf8proc_errmsg(len) + "; the text is not valid UTF-8");
        offset_map.emplace_back(normalized.size(), raw_base + subs[k]);
        normalized.append(reinterpret_cast<char*>(buf), size_t(len));
        std::free(buf);
      }
      offset_map.emplace_back(normalized.size(), raw_base + text.size());
      changed = normalized != text;
      if (changed) text = normalized;
    }
  }
  const std::vector<std::pair<size_t, size_t>>* map = changed ? &offset_map : nullptr;
  const size_t base = map ? 0 : raw_base;  // offsets below are normalised ones when mapped
  std::string prefixed;
  size_t shift = 0;
  if (prefix_space && text.front() != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
    shift = 1;
  }
  auto piece_at = [&](size_t s, size_t e) {
    const size_t start = s >= shift ? s - shift : 0;
    emit_piece(text.substr(s, e - s), base + start, out, track, map);
  };
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;  // end of the last piece emitted
  size_t at = 0;   // where to search from
  while (at < text.size()) {
    const int rc = pcre2_match(regex.get(), subject, text.size(), at, PCRE2_NO_UTF_CHECK, md,
                               nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error(origin + ": pre-tokenizer regex failed: " +
                               reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (e == s) {  // empty match: step one character (the patterns in use never do this)
      at = e + std::max<size_t>(1, utf8_sequence_length(text, e));
      continue;
    }
    if (s > pos) piece_at(pos, s);  // the gap before the match: Isolated keeps it
    piece_at(s, e);
    pos = at = e;
  }
  if (pos < text.size()) piece_at(pos, text.size());
}

// One segment of a SentencePiece-style file (the text between added tokens, starting at raw
// offset raw_base): the normalizer's Prepend/Replace steps, then Metaspace, then BPE per piece.
// map[i] is the raw offset of normalised byte i, so that tracked tokens find their part.
void Tokenizer::Impl::encode_segment_sp(std::string_view text, size_t raw_base,
                                        std::vector<int32_t>& out, Track* track) const {
  if (text.empty()) return;
  std::string norm(text);
  std::vector<uint32_t> map(text.size());
  for (size_t i = 0; i < map.size(); ++i) map[i] = uint32_t(raw_base + i);
  // Replace `from` by `to` everywhere; the bytes of `to` map to where `from` began.
  auto replace = [&](std::string_view from, std::string_view to) {
    if (norm.find(from) == std::string::npos) return;
    std::string s;
    std::vector<uint32_t> m;
    s.reserve(norm.size() + norm.size() / 2);
    m.reserve(s.capacity());
    for (size_t i = 0; i < norm.size();) {
      if (norm.compare(i, from.size(), from) == 0) {
        s.append(to);
        m.insert(m.end(), to.size(), map[i]);
        i += from.size();
      } else {
        s.push_back(norm[i]);
        m.push_back(map[i]);
        ++i;
      }
    }
    norm.swap(s);
    map.swap(m);
  };
  auto prepend = [&](std::string_view p) {
    norm.insert(0, p);
    map.insert(map.begin(), p.size(), map.empty() ? uint32_t(raw_base) : map.front());
  };
  for (const NormStep& step : sp_normalizer) {
    if (step.prepend) {
      if (!norm.empty()) prepend(step.to);  // tokenizers' Prepend skips empty text
    } else {
      replace(step.from, step.to);
    }
  }
  std::vector<std::pair<size_t, size_t>> pieces;  // [start, end) in norm
  if (metaspace) {
    replace(" ", metaspace_replacement);
    // "first": only the segment that starts the text (tokenizers checks the segment's offset
    // in the original text), and never twice.
    const bool want = metaspace_prepend == Prepend::always ||
                      (metaspace_prepend == Prepend::first && raw_base == 0);
    if (want && norm.compare(0, metaspace_replacement.size(), metaspace_replacement) != 0)
      prepend(metaspace_replacement);
    if (metaspace_split) {  // split before every replacement (MergedWithNext)
      size_t begin = 0;
      for (size_t p = norm.find(metaspace_replacement, 1); p != std::string::npos;
           p = norm.find(metaspace_replacement, p + 1)) {
        pieces.emplace_back(begin, p);
        begin = p;
      }
      pieces.emplace_back(begin, norm.size());
    }
  }
  if (pieces.empty()) pieces.emplace_back(0, norm.size());
  std::vector<uint32_t> lens;
  for (const auto& [b, e] : pieces) {
    if (e == b) continue;
    const std::string_view piece = std::string_view(norm).substr(b, e - b);
    const size_t first = out.size();
    encode_piece(piece, out);
    if (!track) continue;
    // Token lengths follow from the ids, except for <unk>, whose length the word knows.
    lens.clear();
    bool has_unk = false;
    for (size_t k = first; k < out.size(); ++k) {
      has_unk |= out[k] == unk_id;
      lens.push_back(norm_len[size_t(out[k])]);
    }
    if (has_unk) {
      out.resize(first);
      lens.clear();
      sp_word(piece, out, &lens);
    }
    size_t off = b;
    for (uint32_t len : lens) {
      track->starts->push_back(map[std::min(off, map.size() - 1)]);
      off += len;
    }
  }
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out,
                                  Track* track) const {
  if (const size_t bad = utf8_first_invalid(text); bad != std::string_view::npos)
    throw UserError("text is not valid UTF-8 (byte " + std::to_string(bad) +
                    "); fix the encoding of the input");
  std::unique_ptr<pcre2_match_data, Pcre2MatchDataDeleter> md(
      regex ? pcre2_match_data_create_from_pattern(regex.get(), nullptr) : nullptr);
  auto segment = [&](size_t start, size_t len) {
    if (sentencepiece)
      encode_segment_sp(text.substr(start, len), start, out, track);
    else
      encode_segment(text.substr(start, len), start, out, md.get(), track);
  };
  // Cut out added tokens: at the leftmost position where one matches, the longest one.
  size_t seg_start = 0, i = 0;
  const size_t n = text.size();
  while (i < n && !added.empty()) {
    if (!added_first_byte[uint8_t(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* hit = nullptr;
    size_t hit_len = 0;
    for (size_t len : added_lengths) {
      if (i + len > n) continue;
      auto it = added_by_content.find(text.substr(i, len));
      if (it != added_by_content.end()) {
        hit = &added[it->second];
        hit_len = len;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t s = i, e = i + hit_len;
    if (hit->single_word && ((s > 0 && is_word_byte(uint8_t(text[s - 1]))) ||
                             (e < n && is_word_byte(uint8_t(text[e]))))) {
      i = e;  // not a whole word: leave it to the BPE
      continue;
    }
    if (hit->lstrip)
      while (s > seg_start && is_ascii_space(text[s - 1])) --s;
    if (hit->rstrip)
      while (e < n && is_ascii_space(text[e])) ++e;
    segment(seg_start, s - seg_start);
    out.push_back(hit->id);
    if (track) track->starts->push_back(uint32_t(i));
    seg_start = i = e;
  }
  segment(seg_start, text.size() - seg_start);
}

// tokenizers' decode for a SentencePiece-style file: the strings of the ids (special ones dropped
// first when asked), each decoder step over the whole list in order, then concatenation.
std::string Tokenizer::Impl::decode_sp(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids)
    if (!skip_special || !(id_flags[size_t(id)] & 4)) toks.push_back(id_to_token[size_t(id)]);
  if (!has_decoder) {  // tokenizers joins the token strings with spaces
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  auto first_char = [](std::string_view s, size_t i, size_t* len) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    utf8proc_ssize_t(s.size() - i), &cp);
    *len = n > 0 ? size_t(n) : 1;
    return char32_t(cp);
  };
  for (const DecodeStep& step : decoder) {
    switch (step.kind) {
      case DecodeStep::Kind::replace:
        for (auto& t : toks) t = replace_all(t, step.from, step.to);
        break;
      case DecodeStep::Kind::byte_fallback: {
        // A run of <0xNN> tokens becomes its bytes if they are valid UTF-8, else one U+FFFD per
        // token (not per maximal subpart: tokenizers' ByteFallback).
        std::vector<std::string> next;
        std::string run;
        size_t run_tokens = 0;
        auto flush = [&] {
          if (!run_tokens) return;
          if (utf8_first_invalid(run) == std::string_view::npos) {
            next.push_back(run);
          } else {
            for (size_t k = 0; k < run_tokens; ++k) next.emplace_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_tokens = 0;
        };
        for (auto& t : toks) {
          unsigned v = 0;
          if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' &&
              std::isxdigit(uint8_t(t[3])) && std::isxdigit(uint8_t(t[4])) &&
              std::sscanf(t.c_str() + 3, "%2x", &v) == 1) {
            run.push_back(char(v));
            ++run_tokens;
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        toks.swap(next);
        break;
      }
      case DecodeStep::Kind::fuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case DecodeStep::Kind::strip:
        for (auto& t : toks) {
          size_t b = 0, len = 0;
          for (size_t k = 0; k < step.start && b < t.size(); ++k) {
            if (first_char(t, b, &len) != step.strip_char) break;
            b += len;
          }
          size_t e = t.size();
          for (size_t k = 0; k < step.stop && e > b; ++k) {
            size_t start = e - 1;  // back up to the last character's lead byte
            while (start > b && (uint8_t(t[start]) & 0xC0) == 0x80) --start;
            if (first_char(t, start, &len) != step.strip_char) break;
            e = start;
          }
          t = t.substr(b, e - b);
        }
        break;
      case DecodeStep::Kind::metaspace:
        // Every replacement character becomes a space, except in the first string, where
        // (unless prepend_scheme is "never") all of them are dropped.
        for (size_t i = 0; i < toks.size(); ++i)
          toks[i] = replace_all(toks[i], step.from, i == 0 && step.metaspace_prepends ? "" : " ");
        break;
    }
  }
  std::string s;
  for (const auto& t : toks) s += t;
  return s;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  json j;
  try {
    j = json::parse(tokenizer_json);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number too large
    throw UserError(origin + ": not valid JSON (" + e.what() +
                    "); expected a Hugging Face tokenizer.json");
  }
  try {
    impl->parse(j);
  } catch (const json::exception& e) {
    throw UserError(origin + ": unexpected structure (" + e.what() +
                    "); expected a Hugging Face tokenizer.json of a byte-level BPE model");
  }
  return Tokenizer(std::move(impl));
}

namespace {
std::optional<std::string> token_field(const json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg.at(key).is_null()) return std::nullopt;
  const json& v = cfg.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return v.at("content").get<std::string>();
  return std::nullopt;
}
}  // namespace

void Tokenizer::read_config(const std::filesystem::path& cfg_path) {
  json cfg;
  try {
    cfg = json::parse(read_file(cfg_path));
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number too large
    throw UserError(cfg_path.string() + ": not valid JSON (" + e.what() + ")");
  }
  TokenizerConfig c;
  c.path = cfg_path.string();
  c.bos_token = token_field(cfg, "bos_token");
  c.eos_token = token_field(cfg, "eos_token");
  c.pad_token = token_field(cfg, "pad_token");
  if (cfg.contains("add_bos_token") && cfg.at("add_bos_token").is_boolean())
    c.add_bos_token = cfg.at("add_bos_token").get<bool>();
  if (cfg.contains("add_eos_token") && cfg.at("add_eos_token").is_boolean())
    c.add_eos_token = cfg.at("add_eos_token").get<bool>();
  if (cfg.contains("chat_template")) {
    const json& ct = cfg.at("chat_template");
    if (ct.is_string()) {
      c.chat_template = ct.get<std::string>();
    } else if (ct.is_array()) {  // [{"name": "default", "template": ...}, ...]
      // json::value() throws nlohmann's type_error on a field of another type (found by
      // fuzz/fuzz_tokenizer_config.cpp): each entry is checked first.
      for (const auto& e : ct) {
        if (!e.is_object() || !e.contains("name") || !e.at("name").is_string() || !e.contains("template") ||
            !e.at("template").is_string())
          throw UserError(cfg_path.string() +
                          ": chat_template: each entry of the list must be {\"name\": \"...\", \"template\": \"...\"}");
        if (e.at("name").get<std::string>() == "default") c.chat_template = e.at("template").get<std::string>();
      }
    }
  }
  for (const auto* tok : {&c.bos_token, &c.eos_token, &c.pad_token})
    if (*tok && !token_id(**tok))
      throw UserError(cfg_path.string() + ": token \"" + **tok + "\" is not in the vocabulary of " +
                      origin() + "; the two files do not belong together");
  impl_->config = std::move(c);
}

Tokenizer Tokenizer::load(const std::filesystem::path& model_dir_or_file) {
  namespace fs = std::filesystem;
  fs::path file = model_dir_or_file;
  std::error_code ec;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  if (!fs::exists(file, ec))
    throw UserError(file.string() +
                    ": not found; give the model directory that holds tokenizer.json (as "
                    "downloaded from the Hugging Face hub)");
  Tokenizer t = from_json(read_file(file), file.string());
  const fs::path cfg_path = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path, ec)) t.read_config(cfg_path);
  return t;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  impl_->encode_text(text, out, nullptr);
}

void Tokenizer::encode_parts(std::span<const std::string_view> parts, std::vector<int32_t>& ids,
                             std::vector<int32_t>& part_of_token) const {
  std::string joined;
  std::vector<size_t> cuts;  // raw offset where each part begins
  for (const auto& p : parts) {
    cuts.push_back(joined.size());
    joined += p;
  }
  std::vector<uint32_t> starts;
  Impl::Track track{&starts, &cuts};
  const size_t first = ids.size();
  impl_->encode_text(joined, ids, &track);
  for (size_t k = 0; k < ids.size() - first; ++k) {
    // The part holding the token's first byte (the last part that begins at or before it).
    const auto it = std::upper_bound(cuts.begin(), cuts.end(), size_t(starts[k]));
    part_of_token.push_back(int32_t(it - cuts.begin()) - 1);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  for (int32_t id : ids)
    if (id < 0 || id >= impl_->vocab_size || !(impl_->id_flags[size_t(id)] & 1))
      throw UserError("token id " + std::to_string(id) + " is not in the vocabulary of " +
                      impl_->origin + " (ids 0.." + std::to_string(impl_->vocab_size - 1) + ")");
  if (impl_->sentencepiece) return impl_->decode_sp(ids, skip_special);
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && (impl_->id_flags[size_t(id)] & 4)) continue;
    bytes += impl_->id_to_bytes[size_t(id)];
  }
  return utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end())
    return impl_->added[it->second].id;
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size)
    throw UserError("token id " + std::to_string(id) + " is outside the vocabulary of " +
                    impl_->origin);
  return impl_->id_to_token[size_t(id)];
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && (impl_->id_flags[size_t(id)] & 4);
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const TokenizerConfig& Tokenizer::config() const { return impl_->config; }
const std::string& Tokenizer::origin() const { return impl_->origin; }

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->config.bos_token ? token_id(*impl_->config.bos_token) : std::nullopt;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->config.eos_token ? token_id(*impl_->config.eos_token) : std::nullopt;
}
std::optional<int32_t> Tokenizer::pad_id() const {
  return impl_->config.pad_token ? token_id(*impl_->config.pad_token) : std::nullopt;
}

}  // namespace forja::data
