// libFuzzer target for tokenizer.json (data/tokenizer.h): part 1 is the file, part 2 a text.
// Tokenizer::from_json accepts or throws UserError; an accepted tokenizer must encode the text
// (or reject invalid UTF-8 with UserError), decode the ids back, and decode any in-range ids.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "data/tokenizer.h"
#include "fuzz_support.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = forja::fuzz::split_parts(data, size, 2);
  try {
    const auto tok = forja::data::Tokenizer::from_json(parts[0], "tokenizer.json");
    if (tok.vocab_size() <= 0) std::abort();
    try {
      const std::vector<std::int32_t> ids = tok.encode(parts[1]);
      for (std::int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) std::abort();
      (void)tok.decode(ids);
      (void)tok.decode(ids, /*skip_special=*/true);
    } catch (const forja::UserError&) {
    }
    // Ids from the text's bytes: every id below vocab_size decodes or is a UserError.
    std::vector<std::int32_t> raw;
    for (unsigned char ch : parts[1]) raw.push_back(static_cast<std::int32_t>(ch) % tok.vocab_size());
    try {
      (void)tok.decode(raw);
    } catch (const forja::UserError&) {
    }
    for (std::int32_t id = 0; id < tok.vocab_size() && id < 64; ++id) (void)tok.token_text(id);
  } catch (const forja::UserError&) {
  }
  return 0;
}
