// BPE tokenizer read from a Hugging Face tokenizer.json, giving the same ids as the `tokenizers`
// library, in two families (docs/formats.md 5.1 and 5.4):
//
// Byte-level BPE (Qwen2/2.5/3, Llama 3):
//   1. added tokens (<|im_start|>, <think>, ...) are cut out of the raw text first, leftmost-longest;
//   2. each remaining segment is NFC-normalised (utf8proc) when the file asks for it;
//   3. the Split pre-tokenizer regex, read from the file, cuts it into pieces (PCRE2, UTF + UCP, JIT);
//   4. each piece's bytes become symbols of the 256-symbol byte alphabet;
//   5. BPE merges the adjacent pair of lowest rank (leftmost on ties) until none applies;
//      with `ignore_merges` a piece that is whole in the vocabulary is emitted directly.
//
// SentencePiece-style BPE with byte fallback (Mistral v0.1-v0.3, Llama 2):
//   1. added tokens are cut out as above;
//   2. each segment goes through the normalizer's Prepend("▁") / Replace(" ", "▁") steps (the
//      legacy Llama form) or the Metaspace pre-tokenizer (spaces become "▁", and "▁" is
//      prepended to the first segment, every segment or none, per prepend_scheme; the segment
//      is split before each "▁" or not);
//   3. each piece starts as its characters' vocabulary ids; a character that is not in the
//      vocabulary becomes its UTF-8 bytes' <0xNN> tokens (byte_fallback), else <unk>;
//   4. the same merge loop as above; decoding runs the file's decoder steps (Replace,
//      ByteFallback, Fuse, Strip, Metaspace) over the token strings.
// Results per piece are cached, so common words cost one hash lookup.
//
// tokenizer_config.json beside tokenizer.json supplies bos/eos/pad tokens and the chat template.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forja::data {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // removed by decode(..., skip_special=true)
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // matches only when not inside a word
  bool normalized = false;
};

// The parts of tokenizer_config.json that training needs. Token fields hold the token's text.
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> chat_template;  // the Jinja source; "default" of a named list
  bool add_bos_token = false;
  bool add_eos_token = false;
  std::string path;  // where it was read from, "" if there was none
};

class Tokenizer {
 public:
  // model_dir_or_file: a model directory holding tokenizer.json (and usually
  // tokenizer_config.json), or the path of a tokenizer.json itself.
  static Tokenizer load(const std::filesystem::path& model_dir_or_file);
  // From tokenizer.json text; `origin` names it in errors. No tokenizer_config.
  static Tokenizer from_json(std::string_view tokenizer_json, const std::string& origin);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ids of `text`, adding no special tokens beyond those written in it. `text` must be valid
  // UTF-8 (UserError otherwise). Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;
  // Encodes the concatenation of `parts` (the same ids as encode() of the joined text, except
  // that NFC is applied to each part on its own) and appends to part_of_token, for each token,
  // the index of the part that holds its first byte. Used to label rendered chat segments.
  void encode_parts(std::span<const std::string_view> parts, std::vector<int32_t>& ids,
                    std::vector<int32_t>& part_of_token) const;

  // Text of `ids`; invalid UTF-8 from partial tokens becomes U+FFFD. Ids outside the vocabulary
  // are a UserError. skip_special drops added tokens flagged special.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Id of a token given by its text: an added token's content or a vocabulary entry (in the
  // vocabulary's alphabet: byte-mapped "Ġthe", or SentencePiece's "▁the"). nullopt if none.
  std::optional<int32_t> token_id(std::string_view token) const;
  // The token's text as stored (added token content, or vocab string in its alphabet).
  const std::string& token_text(int32_t id) const;
  // One more than the largest id used (model vocab and added tokens). The model's embedding may
  // have more rows (Qwen3: 151669 used, 151936 rows).
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

  const TokenizerConfig& config() const;
  // Reads a tokenizer_config.json into config(), replacing it (load() does this for the one
  // beside tokenizer.json). UserError, with config() unchanged, when the file is not JSON or names
  // a token outside this vocabulary.
  void read_config(const std::filesystem::path& tokenizer_config_json);
  // Ids of the config's tokens; nullopt when the config names none.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // Where the tokenizer came from, for messages.
  const std::string& origin() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace forja::data
