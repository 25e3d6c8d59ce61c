// The runtime itself: allocation and alignment, transfers larger than the staging buffer,
// dispatch with push constants, and hazard barriers between dependent dispatches.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "kernels/kernel_table.h"
#include "support/gpu_fixture.h"

namespace forja::test {
namespace {

class GpuContext : public GpuTest {};

struct AxpbPush {
  uint32_t n;
  float a, b;
};
static_assert(kernels::push_block_matches<AxpbPush>(kernels::fill_test));

TEST_F(GpuContext, ReportsDeviceLimits) {
  const auto& info = ctx().info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.max_storage_buffer_range, 1u << 20);
  EXPECT_GT(info.subgroup_size, 0u);
  EXPECT_GE(info.max_shared_memory, 16u * 1024);
}

TEST_F(GpuContext, AllocationsAreAlignedAndDisjoint) {
  std::vector<gpu::Buffer> bufs;
  for (uint64_t n : {1ull, 17ull, 4096ull, 100000ull, 3ull}) bufs.push_back(ctx().alloc(n));
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(bufs[i].offset % ctx().info().min_storage_offset_alignment, 0u);
    for (size_t j = 0; j < i; ++j) {
      if (bufs[i].buffer != bufs[j].buffer) continue;
      bool disjoint = bufs[i].offset + bufs[i].size <= bufs[j].offset || bufs[j].offset + bufs[j].size <= bufs[i].offset;
      EXPECT_TRUE(disjoint) << i << " overlaps " << j;
    }
  }
  const uint64_t before = ctx().arena().bytes_in_use();
  for (auto& b : bufs) ctx().free(b);
  EXPECT_LT(ctx().arena().bytes_in_use(), before);
  // Freed space is reused: the same request lands at an address handed out before.
  gpu::Buffer again = ctx().alloc(4096);
  EXPECT_TRUE(again.valid());
  ctx().free(again);
}

TEST_F(GpuContext, UploadDownloadRoundTripLargerThanStaging) {
  const size_t n = (80u << 20) / 4;  // 80 MiB: more than one staging chunk (64 MiB)
  std::vector<uint32_t> data(n);
  std::iota(data.begin(), data.end(), 12345u);
  gpu::Buffer b = ctx().alloc(n * 4);
  ctx().upload(b, data);
  auto back = ctx().download<uint32_t>(b, n);
  EXPECT_EQ(back, data);
  ctx().free(b);
}

TEST_F(GpuContext, DependentDispatchesSeeEachOthersResults) {
  const uint32_t n = 1000;
  std::vector<float> x(n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : x) v = u(rng);
  gpu::Buffer a = ctx().alloc(n * 4), b = ctx().alloc(n * 4);
  ctx().upload(a, x);
  const auto& p = ctx().pipelines().get(kernels::fill_test);
  // a -> b -> a -> b: every step reads what the previous one wrote.
  const uint64_t barriers_before = ctx().barriers_recorded();
  for (int i = 0; i < 4; ++i) {
    bool even = i % 2 == 0;
    ctx().dispatch(p, {{even ? a : b, gpu::Access::read}, {even ? b : a, gpu::Access::write}},
                   AxpbPush{n, 2.0f, 1.0f}, (n + 63) / 64);
  }
  auto y = ctx().download<float>(a, n);  // the 4th step wrote a
  EXPECT_GE(ctx().barriers_recorded() - barriers_before, 3u);
  for (uint32_t i = 0; i < n; ++i) {
    float e = x[i];
    for (int k = 0; k < 4; ++k) e = e * 2.0f + 1.0f;
    ASSERT_FLOAT_EQ(y[i], e) << i;
  }
  ctx().free(a);
  ctx().free(b);
}

TEST_F(GpuContext, IndependentDispatchesNeedNoBarrier) {
  const uint32_t n = 256;
  gpu::Buffer x = ctx().alloc(n * 4), y1 = ctx().alloc(n * 4), y2 = ctx().alloc(n * 4);
  ctx().fill(x, 0);
  ctx().finish();
  const auto& p = ctx().pipelines().get(kernels::fill_test);
  ctx().dispatch(p, {{x, gpu::Access::read}, {y1, gpu::Access::write}}, AxpbPush{n, 1.0f, 3.0f}, 4);
  const uint64_t before = ctx().barriers_recorded();
  ctx().dispatch(p, {{x, gpu::Access::read}, {y2, gpu::Access::write}}, AxpbPush{n, 1.0f, 5.0f}, 4);
  EXPECT_EQ(ctx().barriers_recorded(), before);  // reads of x only: no hazard
  EXPECT_EQ(ctx().download<float>(y1, n)[n - 1], 3.0f);
  EXPECT_EQ(ctx().download<float>(y2, n)[0], 5.0f);
  for (auto& b : {x, y1, y2}) ctx().free(b);
}

// FORJA_PROFILE=serial: a barrier before every dispatch, hazard or not, so each timed op runs
// alone; both dispatches are filed under their op name.
TEST(GpuContextProfile, SerialProfileRunsEachDispatchAlone) {
  ::setenv("FORJA_PROFILE", "serial", 1);
  std::unique_ptr<gpu::Context> c = gpu::Context::create(-1, /*quiet=*/true);
  ::unsetenv("FORJA_PROFILE");
  if (!c->profiling()) GTEST_SKIP() << "the device has no compute timestamps";
  EXPECT_TRUE(c->profiling_shapes());
  const uint32_t n = 256;
  gpu::Buffer x = c->alloc(n * 4), y1 = c->alloc(n * 4), y2 = c->alloc(n * 4);
  c->fill(x, 0);
  c->finish();
  const auto& p = c->pipelines().get(kernels::fill_test);
  const uint64_t before = c->barriers_recorded();
  c->dispatch(p, {{x, gpu::Access::read}, {y1, gpu::Access::write}}, AxpbPush{n, 1.0f, 3.0f}, 4, 1, 1, "serial_op");
  c->dispatch(p, {{x, gpu::Access::read}, {y2, gpu::Access::write}}, AxpbPush{n, 1.0f, 5.0f}, 4, 1, 1, "serial_op");
  EXPECT_EQ(c->barriers_recorded() - before, 2u);  // no hazard between them, a barrier before each
  EXPECT_EQ(c->download<float>(y2, n)[0], 5.0f);
  c->finish();
  ASSERT_EQ(c->profile().count("serial_op"), 1u);
  EXPECT_EQ(c->profile().at("serial_op").count, 2u);
  for (auto& b : {x, y1, y2}) c->free(b);
}

// FORJA_SKIP_OPS (measuring only): dispatches whose op name starts with a listed prefix are not
// recorded; the others run as usual.
TEST(GpuContextSkipOps, LeavesOutTheListedOpsOnly) {
  ::setenv("FORJA_SKIP_OPS", "skip_me,,also_", 1);
  std::unique_ptr<gpu::Context> c = gpu::Context::create(-1, /*quiet=*/true);
  ::unsetenv("FORJA_SKIP_OPS");
  EXPECT_EQ(c->skipped_ops(), (std::vector<std::string>{"skip_me", "also_"}));
  const uint32_t n = 256;
  gpu::Buffer x = c->alloc(n * 4), y1 = c->alloc(n * 4), y2 = c->alloc(n * 4), y3 = c->alloc(n * 4);
  for (const gpu::Buffer& b : {x, y1, y2, y3}) c->fill(b, 0);
  const auto& p = c->pipelines().get(kernels::fill_test);
  c->dispatch(p, {{x, gpu::Access::read}, {y1, gpu::Access::write}}, AxpbPush{n, 1.0f, 3.0f}, 4, 1, 1, "skip_me");
  c->dispatch(p, {{x, gpu::Access::read}, {y2, gpu::Access::write}}, AxpbPush{n, 1.0f, 5.0f}, 4, 1, 1, "also_this");
  c->dispatch(p, {{x, gpu::Access::read}, {y3, gpu::Access::write}}, AxpbPush{n, 1.0f, 7.0f}, 4, 1, 1, "skip");
  EXPECT_EQ(c->dispatches_skipped(), 2u);
  EXPECT_EQ(c->download<float>(y1, n)[0], 0.0f);
  EXPECT_EQ(c->download<float>(y2, n)[0], 0.0f);
  EXPECT_EQ(c->download<float>(y3, n)[0], 7.0f);  // "skip" is not "skip_me"
  for (auto& b : {x, y1, y2, y3}) c->free(b);
}

}  // namespace
}  // namespace forja::test
