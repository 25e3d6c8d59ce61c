// libFuzzer target for a PEFT adapter directory (io/adapter.h load_adapter): part 1 is
// adapter_config.json, part 2 adapter_model.safetensors, read against the example model's
// projection shapes. Loading accepts or throws UserError; an accepted adapter has every factor of
// every targeted projection with its shape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_support.h"
#include "io/adapter.h"
#include "model/config.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const forja::io::LoraTargetShapes shapes =
      forja::model::lora_target_shapes(forja::model::load_model_config(forja::fuzz::example_model_dir()));
  static const auto dir = [] {
    const auto d = forja::fuzz::scratch_dir() / "adapter";
    std::filesystem::create_directories(d);
    return d;
  }();
  const auto parts = forja::fuzz::split_parts(data, size, 2);
  forja::fuzz::write_bytes(dir / "adapter_config.json", parts[0]);
  forja::fuzz::write_bytes(dir / "adapter_model.safetensors", parts[1]);
  try {
    const forja::io::Adapter a = forja::io::load_adapter(dir, shapes);
    for (const forja::io::LoraWeights& w : a.weights) {
      const forja::io::LoraTarget* t = shapes.find(w.target);
      if (!t) std::abort();
      if (static_cast<std::int64_t>(w.a.size()) != a.config.r * t->in_features) std::abort();
      if (static_cast<std::int64_t>(w.b.size()) != a.config.r * t->out_features) std::abort();
    }
  } catch (const forja::UserError&) {
  }
  return 0;
}
