// libFuzzer target for the YAML run configuration (train/run_config.h, `forja train --config`):
// load_yaml then validate accept or throw UserError. A configuration that loads must also come
// back unchanged through config.yaml (to_yaml, as every run writes it, and load_yaml again): that
// is what `--config OUT/config.yaml` and --resume rely on.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fuzz_support.h"
#include "train/run_config.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto file = forja::fuzz::scratch_dir() / "run.yaml";
  static const auto again = forja::fuzz::scratch_dir() / "config.yaml";
  forja::fuzz::write_bytes(file, std::string_view(reinterpret_cast<const char*>(data), size));
  forja::train::RunConfig c;
  try {
    c.load_yaml(file);
  } catch (const forja::UserError&) {
    return 0;
  }
  try {
    c.validate();
  } catch (const forja::UserError&) {
  }
  const std::string yaml = c.to_yaml();
  forja::fuzz::write_bytes(again, yaml);
  forja::train::RunConfig back;
  try {
    back.load_yaml(again);
  } catch (const forja::UserError& e) {
    std::fprintf(stderr, "config.yaml of an accepted configuration does not load: %s\n%s\n", e.what(),
                 yaml.c_str());
    std::abort();
  }
  if (back.to_yaml() != yaml) {
    std::fprintf(stderr, "config.yaml does not round-trip:\n%s\n---\n%s\n", yaml.c_str(),
                 back.to_yaml().c_str());
    std::abort();
  }
  return 0;
}
