// UTF-8 helpers shared by the tokenizer and the dataset reader: validation (to name the first bad
// byte in an error) and lossy decoding that replaces each maximal invalid subsequence by U+FFFD,
// as Rust's String::from_utf8_lossy and Python's errors="replace" do (Unicode 15, section 3.9,
// "substitution of maximal subparts").
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace forja::data {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if none starts there. On 0,
// `*bad_len` (if given) receives the length of the maximal subpart to replace (at least 1).
size_t utf8_sequence_length(std::string_view s, size_t i, size_t* bad_len = nullptr);

// Offset of the first byte that is not part of valid UTF-8, or std::string_view::npos.
size_t utf8_first_invalid(std::string_view s);

// s with every maximal invalid subsequence replaced by U+FFFD.
std::string utf8_lossy(std::string_view s);

// Appends the UTF-8 encoding of code point cp.
void utf8_append(std::string& out, char32_t cp);

}  // namespace forja::data
