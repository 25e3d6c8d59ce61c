// libFuzzer target for the safetensors parser: any byte string is a candidate file image (8-byte
// length, header JSON, data). parse_safetensors must either accept it or throw UserError; any
// other exception, crash, leak or sanitizer report is a bug. Accepted images are also checked for
// the invariants the reader promises (tensors tile the data exactly, in order).
//
// Build and run (docs/fuzzing.md):
//   scripts/fuzz build && scripts/fuzz run safetensors_header build-asan -max_total_time=300
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "io/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    forja::io::SafetensorsHeader h = forja::io::parse_safetensors(bytes, "fuzz.safetensors");
    std::uint64_t position = 0;
    for (const forja::io::TensorInfo& t : h.tensors) {
      if (t.begin != position || t.end < t.begin) std::abort();
      if (t.byte_size() != static_cast<std::uint64_t>(t.numel()) * forja::io::dtype_size(t.dtype))
        std::abort();
      position = t.end;
    }
    if (position != h.data_size || 8 + h.header_size + h.data_size != size) std::abort();
  } catch (const forja::UserError&) {
    // rejected with a message: the expected outcome for malformed input
  }
  return 0;
}
