#include "data/text_stream.h"

namespace forja::data {

namespace {
constexpr size_t kMaxHeld = 8;  // a UTF-8 character has at most 4 bytes, so at most 4 byte tokens
bool ends_with_replacement(const std::string& s) { return s.size() >= 3 && s.ends_with("\xEF\xBF\xBD"); }
}  // namespace

std::string TextStream::push(int32_t id) {
  pending_.push_back(id);
  std::string text = tokenizer_.decode(pending_, skip_special_);
  if (ends_with_replacement(text) && pending_.size() < kMaxHeld) return {};
  pending_.clear();
  return text;
}

std::string TextStream::flush() {
  std::string text = pending_.empty() ? std::string() : tokenizer_.decode(pending_, skip_special_);
  pending_.clear();
  return text;
}

}  // namespace forja::data
