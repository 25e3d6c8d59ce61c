// libFuzzer target for generation_config.json (model/generation_config.h): the defaults, the
// settings, or a UserError.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_support.h"
#include "model/generation_config.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto dir = [] {
    const auto d = forja::fuzz::scratch_dir() / "generation";
    std::filesystem::create_directories(d);
    return d;
  }();
  forja::fuzz::write_bytes(dir / "generation_config.json",
                           std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const auto g = forja::model::load_generation_config(dir);
    if (g.top_k && *g.top_k < 0) std::abort();
  } catch (const forja::UserError&) {
  }
  return 0;
}
