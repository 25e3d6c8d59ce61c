// Streaming detokenisation: the text of generated tokens as they come, never splitting a
// multi-byte UTF-8 character that spans several tokens (a token whose decoded text ends in an
// incomplete character is held back until the next tokens complete it). Each step decodes the
// new tokens after the last emitted one and keeps what that context adds, because
// SentencePiece decoders treat the first token specially (Strip / Metaspace drop its leading
// space): decoded alone, every "▁world" would lose its space.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace forja::data {

class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // The text that becomes complete with `id` (often empty while a character is incomplete).
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character at the end becomes U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> pending_;  // the last emitted token (if any), then the held-back ones
  bool has_context_ = false;      // pending_[0] was emitted already
};

}  // namespace forja::data
