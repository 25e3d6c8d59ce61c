// libFuzzer target for tokenizer_config.json (data/tokenizer.h, data/chat_template.h): the
// example model's tokenizer.json beside the input as tokenizer_config.json. Loading accepts or
// throws UserError; an accepted config must give a chat template (or a UserError saying how to
// choose one) that renders a conversation.
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
  static const fs::path dir = [] {
    const fs::path d = forja::fuzz::scratch_dir() / "tokenizer";
    fs::create_directories(d);
    fs::copy_file(forja::fuzz::example_model_dir() / "tokenizer.json", d / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    return d;
  }();
  forja::fuzz::write_bytes(dir / "tokenizer_config.json",
                           std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const auto tok = forja::data::Tokenizer::load(dir);
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
