// What a compute kernel's SPIR-V declares of its interface with the host: the storage buffers
// of set 0 it binds and the size of its push-constant block. The build tool cmake/kernel_table.cpp
// reads every kernel's interface with it into the generated kernels/kernel_table.h, against which
// each op static_asserts its push-constant struct (kernels/kernel.h), so a C++ struct that drifts
// from its GLSL block (a field added on one side only) fails the build instead of a kernel
// reading garbage.
#pragma once
#include <cstdint>
#include <string>

namespace forja::gpu {

struct SpirvInterface {
  uint32_t bindings = 0;    // 1 + the highest Binding of a buffer variable in set 0 (0: none)
  uint32_t push_bytes = 0;  // bytes of the push-constant block's type (0: none)
};

// Reads the interface from a SPIR-V module (words, word_count); throws std::runtime_error naming
// `what` when the module is not SPIR-V or its push-constant block has a type it cannot size.
SpirvInterface spirv_interface(const uint32_t* words, size_t word_count, const std::string& what);

}  // namespace forja::gpu
