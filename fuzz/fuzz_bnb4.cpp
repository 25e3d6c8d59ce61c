// libFuzzer target for bitsandbytes 4-bit weights (model/bnb4.h): the input is a model.safetensors
// whose tensors may be a bnb NF4 weight with its quantisation state (codes, absmax, quant_map,
// nested tables, the quant_state JSON). Every "*.weight" is classified and, when it is bnb NF4,
// read against the shape its quant state records; each step accepts or throws UserError.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_support.h"
#include "io/safetensors.h"
#include "model/bnb4.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto dir = [] {
    const auto d = forja::fuzz::scratch_dir() / "bnb";
    std::filesystem::create_directories(d);
    return d;
  }();
  forja::fuzz::write_bytes(dir / "model.safetensors",
                           std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const auto ck = forja::io::SafetensorsCheckpoint::open(dir);
    (void)forja::model::is_bnb_checkpoint(ck);
    for (const std::string& name : ck.names()) {
      if (name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0) continue;
      try {
        if (!forja::model::is_bnb4_weight(ck, name)) continue;
        const auto shape = forja::model::bnb4_weight_shape(ck, name);
        std::int64_t n = 1;
        for (std::int64_t d : shape) n *= d;
        if (n <= 0) std::abort();
        const auto t = forja::model::read_bnb4_weight(ck, name, shape);
        (void)t;
      } catch (const forja::UserError&) {
      }
    }
  } catch (const forja::UserError&) {
  }
  return 0;
}
