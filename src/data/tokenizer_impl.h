// The tokenizer's private state, shared by the two files that implement it and by nothing else:
// tokenizer_parse.cpp reads tokenizer.json and tokenizer_config.json into it, tokenizer.cpp
// encodes and decodes with it. The public interface is tokenizer.h.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace forja::data::detail {

// Hash for heterogeneous lookup of std::string keys by std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

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

// One step of a SentencePiece-style decoder (tokenizers' decoders/*.rs), applied in order to
// the list of token strings; the results are concatenated at the end.
struct DecodeStep {
  enum class Kind { replace, byte_fallback, fuse, strip, metaspace } kind;
  std::string from, to;        // replace: literal pattern and content; metaspace: replacement
  char32_t strip_char = 0;     // strip: the character, at most `start` on the left, `stop` on
  size_t start = 0, stop = 0;  // the right, of each string
  bool metaspace_prepends = false;  // metaspace: prepend_scheme is not "never"
};

}  // namespace forja::data::detail

namespace forja::data {

struct Tokenizer::Impl {
  std::string origin;
  TokenizerConfig config;

  // Vocabulary.
  detail::StringMap<int32_t> vocab;               // model.vocab, mapped alphabet
  std::vector<std::string> id_to_token;   // [vocab_size]: vocab string or added content
  std::vector<std::string> id_to_bytes;   // [vocab_size]: what decode emits for the id
  std::vector<uint8_t> id_flags;          // [vocab_size]: 1 used, 2 added, 4 special
  int32_t vocab_size = 0;
  std::array<int32_t, 256> byte_id{};     // id of each byte's single symbol
  std::array<std::string, 256> byte_str;  // each byte's symbol as UTF-8
  detail::PairMap merges;
  bool ignore_merges = false;

  // Added tokens, matched leftmost-longest on the raw text.
  std::vector<AddedToken> added;
  detail::StringMap<size_t> added_by_content;
  std::array<bool, 256> added_first_byte{};
  std::vector<size_t> added_lengths;  // distinct content lengths, longest first

  bool nfc = false;
  bool prefix_space = false;  // ByteLevel add_prefix_space (only with its own regex)
  std::unique_ptr<pcre2_code, detail::Pcre2CodeDeleter> regex;

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
  std::vector<detail::DecodeStep> decoder;
  bool has_decoder = false;  // no decoder: HF joins the token strings with spaces

  // Piece -> ids cache (ids stored in one arena).
  mutable std::mutex cache_mutex;
  mutable detail::StringMap<std::pair<uint32_t, uint32_t>> cache;
  mutable std::vector<int32_t> cache_ids;

  void parse(const nlohmann::json& j);
  void parse_pre_tokenizer(const nlohmann::json& p);
  void parse_sp_normalizer(const nlohmann::json& n);
  void parse_metaspace(const nlohmann::json& p);
  void parse_sp_decoder(const nlohmann::json& d);
  void parse_sp_vocab(const nlohmann::json& model);
  void parse_byte_vocab();
  void parse_merges(const nlohmann::json& model);
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

}  // namespace forja::data
