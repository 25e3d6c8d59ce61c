#include "support/gpu_fixture.h"

namespace forja::test {

gpu::Context& gpu_context() {
  static std::unique_ptr<gpu::Context> ctx = gpu::Context::create(-1, /*quiet=*/true);
  return *ctx;
}

}  // namespace forja::test
