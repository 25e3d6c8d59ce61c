// The SPIR-V of every kernel variant, compiled from src/kernels/*.comp and embedded at build
// time (cmake/shaders.cmake). A variant's name is the one its .comp file declares.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace forja::kernels {

struct Spirv {
  const char* name;
  const uint32_t* words;
  uint32_t word_count;
};

// Every embedded variant (generated file).
const std::vector<Spirv>& all_spirv();

// The variant named `name`, or nullptr when it was not built (for example a cooperative-matrix
// variant on a compiler without that extension).
inline const Spirv* find_spirv(std::string_view name) {
  for (const Spirv& s : all_spirv())
    if (name == s.name) return &s;
  return nullptr;
}

}  // namespace forja::kernels
