#include "data/text_stream.h"

namespace forja::data {

namespace {
constexpr size_t kMaxHeld = 8;  // a UTF-8 character has at most 4 bytes, so at most 4 byte tokens
bool ends_with_replacement(const std::string& s) { return s.size() >= 3 && s.ends_with("\xEF\xBF\xBD"); }
}  // namespace

std::string TextStream::push(int32_t id) {
  pending_.push_back(id);
  std::string text = tokenizer_.decode(pending_, skip_special_);
  const size_t held = pending_.size() - (has_context_ ? 1 : 0);
  if (ends_with_replacement(text) && held < kMaxHeld) return {};
  if (has_context_) {
    const std::string context = tokenizer_.decode(std::span(pending_).first(1), skip_special_);
    // The context's text is a prefix for every decoder forja reads; should it not be, emit the
    // whole text rather than cut it wrongly.
    if (text.compare(0, context.size(), context) == 0) text.erase(0, context.size());
  }
  pending_.erase(pending_.begin(), pending_.end() - 1);
  has_context_ = true;
  return text;
}

std::string TextStream::flush() {
  std::string text;
  if (pending_.size() > (has_context_ ? 1u : 0u)) {
    text = tokenizer_.decode(pending_, skip_special_);
    if (has_context_) {
      const std::string context = tokenizer_.decode(std::span(pending_).first(1), skip_special_);
      if (text.compare(0, context.size(), context) == 0) text.erase(0, context.size());
    }
  }
  pending_.clear();
  has_context_ = false;
  return text;
}

}  // namespace forja::data
