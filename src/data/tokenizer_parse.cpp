// Reading tokenizer.json into Tokenizer::Impl (both families: byte-level and SentencePiece-style
// BPE) and tokenizer_config.json into TokenizerConfig; docs/formats.md 5.1 and 5.4. Every field
// is checked here, so the encoder in tokenizer.cpp can trust what it is given.
#include <utf8proc.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "data/tokenizer_impl.h"
#include "data/utf8.h"
#include "io/json_file.h"
#include "util/error.h"

namespace forja::data {
namespace {

using detail::DecodeStep;
using nlohmann::json;

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

// GPT-2's pattern, used by ByteLevel when its use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The SentencePiece word marker "▁" (U+2581).
constexpr std::string_view kMetaspace = "\xE2\x96\x81";

}  // namespace

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
    cfg = json::parse(io::read_text_file(cfg_path));
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
  Tokenizer t = from_json(io::read_text_file(file), file.string());
  const fs::path cfg_path = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path, ec)) t.read_config(cfg_path);
  return t;
}


}  // namespace forja::data
