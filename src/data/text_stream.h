// Streaming detokenisation: the text of generated tokens as they come, never splitting a
// multi-byte UTF-8 character that spans several byte-level BPE tokens (a token whose decoded
// text ends in an incomplete character is held back until the next tokens complete it).
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
  std::vector<int32_t> pending_;
};

}  // namespace forja::data
