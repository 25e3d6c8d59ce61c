// libFuzzer target for a checkpoint's own files (train/checkpoint.h, io/checksums.h): part 1 is
// trainer_state.json, part 2 optimizer.safetensors, part 3 SHA256SUMS, beside a valid adapter
// of the example model. verify_sha256sums reports or passes; load_checkpoint accepts or throws
// UserError, and an accepted checkpoint has moments of the adapter's size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_support.h"
#include "io/adapter.h"
#include "io/checksums.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const forja::io::LoraTargetShapes shapes =
      forja::model::lora_target_shapes(forja::model::load_model_config(forja::fuzz::example_model_dir()));
  static const auto dir = [] {
    const auto d = forja::fuzz::scratch_dir() / "checkpoint";
    forja::io::Adapter a;
    a.config.r = 2;
    a.config.lora_alpha = 4;
    for (const auto& t : shapes.targets) a.config.target_modules.push_back(t.name);
    for (std::int64_t layer = 0; layer < shapes.num_layers; ++layer)
      for (const auto& t : shapes.targets)
        a.weights.push_back({layer, t.name, std::vector<float>(2 * t.in_features, 0.5f),
                             std::vector<float>(t.out_features * 2, 0.25f)});
    forja::io::save_adapter(d, a, shapes);
    return d;
  }();
  const auto parts = forja::fuzz::split_parts(data, size, 3);
  forja::fuzz::write_bytes(dir / "trainer_state.json", parts[0]);
  forja::fuzz::write_bytes(dir / "optimizer.safetensors", parts[1]);
  forja::fuzz::write_bytes(dir / "SHA256SUMS", parts[2]);
  try {
    (void)forja::io::verify_sha256sums(dir);
  } catch (const forja::UserError&) {
  }
  try {
    const forja::train::Checkpoint c = forja::train::load_checkpoint(dir, shapes);
    if (c.adam_m.size() != c.adam_v.size()) std::abort();
    if (c.state.world_size < 1) std::abort();
  } catch (const forja::UserError&) {
  }
  return 0;
}
