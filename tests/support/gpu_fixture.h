// Shared GPU context for tests. One Vulkan device per test process (opening one per test would
// dominate the run time on lavapipe). Validation layers are on when FORJA_VALIDATE=1 (CTest sets
// it); any validation message during a test fails that test.
#pragma once
#include <gtest/gtest.h>

#include <memory>

#include "gpu/context.h"

namespace forja::test {

gpu::Context& gpu_context();

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override { messages_before_ = gpu_context().device().validation_messages(); }
  void TearDown() override {
    gpu_context().finish();
    EXPECT_EQ(gpu_context().device().validation_messages(), messages_before_)
        << "Vulkan validation reported problems during this test (see stderr)";
  }
  gpu::Context& ctx() { return gpu_context(); }

 private:
  uint64_t messages_before_ = 0;
};

}  // namespace forja::test
