// libFuzzer target for tokenizer_config.json (data/tokenizer.h, data/chat_template.h): the
// input read as the config of the example model's tokenizer. Reading accepts or throws UserError;
// an accepted config must give a chat template (or a UserError saying how to choose one) that
// renders a conversation.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "fuzz_support.h"
#include "util/error.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // tokenizer.json is parsed once: the input only goes through read_config, the part of
  // Tokenizer::load that reads tokenizer_config.json (about 5 ms per input less).
  static const fs::path file = forja::fuzz::scratch_dir() / "tokenizer_config.json";
  static forja::data::Tokenizer tok = forja::data::Tokenizer::load(forja::fuzz::example_model_dir() / "tokenizer.json");
  forja::fuzz::write_bytes(file, std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    tok.read_config(file);
    (void)tok.bos_id();
    (void)tok.eos_id();
    (void)tok.pad_id();
    const auto chat = forja::data::ChatTemplate::detect(tok.config());
    const std::vector<forja::data::ChatMessage> messages = {
        {"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}};
    (void)chat.render_text(messages);
  } catch (const forja::UserError&) {
  }
  return 0;
}
