// A compute kernel variant as the C++ side names it: one constant per variant in the generated
// "kernels/kernel_table.h" (cmake/kernel_table.cpp writes it at build time from every
// `//! variant` line of src/kernels/*.comp and the compiled SPIR-V), so a call site names a kernel
// by identifier, never by string, and takes its binding count and push-constant size from the
// shader itself. Each op static_asserts its push-constant struct against the kernels it pushes
// it to (push_block_matches below), so a field added on one side only fails the build.
#pragma once
#include <cstdint>

namespace forja::kernels {

struct Kernel {
  const char* name;     // the variant's name: profiles, errors, the embedded SPIR-V's key
  uint32_t bindings;    // storage buffers 0..bindings-1 of set 0 its SPIR-V declares
  uint32_t push_bytes;  // the size of its push-constant block (0: none)
  bool built;           // false: declared, but this build's shader compiler lacks an extension it
                        // needs (cmake/shaders.cmake), so its interface is unknown and it cannot run
};

// True when every built kernel of `kernels` has a push-constant block of sizeof(Push) bytes.
template <class Push, class... Kernels>
constexpr bool push_block_matches(const Kernels&... kernels) {
  return ((!kernels.built || kernels.push_bytes == sizeof(Push)) && ...);
}

}  // namespace forja::kernels
