// RoPE forward and backward against the double-precision reference (ops/ref/rope_ref.h): awkward
// shapes, positions up to a million (where a GPU's built-in cos/sin would be ~1e-3 off), in
// place, with sentinels after the output.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "io/float16.h"
#include "ops/ref/rmsnorm_ref.h"
#include "ops/ref/rope_ref.h"
#include "ops/rope.h"
#include "support/gpu_buffers.h"

namespace forja::test {
namespace {

class RopeTest : public GpuBufferTest {
 protected:
  RopeTest() : GpuBufferTest(11, -2.0f, 2.0f) {}
  // Floats and int32 positions, each padded with kSentinel (as T).
  template <typename T>
  gpu::Buffer upload(const std::vector<T>& v) {
    return GpuBufferTest::upload(v, static_cast<T>(kSentinel));
  }
  // Positions of packed segments (restarting at 0) mixed with large ones.
  std::vector<int32_t> positions(uint32_t tokens) {
    const int32_t large[] = {0, 1, 2, 4095, 32767, 40959, 131071, 999999};
    std::vector<int32_t> p(tokens);
    for (uint32_t t = 0; t < tokens; ++t) p[t] = t % 3 == 2 ? large[(t / 3) % 8] : static_cast<int32_t>(t % 5);
    return p;
  }
  // Qwen3's table (theta 1e6), as fp32 values.
  static std::vector<float> inv_freq(uint32_t head_dim, double theta = 1e6) {
    std::vector<double> d(head_dim / 2);
    ref::rope_inv_freq_default(d.data(), head_dim, theta);
    return {d.begin(), d.end()};
  }
};

struct Shape {
  uint32_t tokens, heads, head_dim;
};

TEST_F(RopeTest, ForwardAndBackwardMatchReference) {
  for (Shape s : {Shape{11, 3, 6}, Shape{11, 3, 16}, Shape{11, 3, 128}, Shape{1, 1, 2}, Shape{300, 3, 128},
                  Shape{7, 16, 64}}) {
    for (bool backward : {false, true}) {
      SCOPED_TRACE(std::to_string(s.tokens) + "x" + std::to_string(s.heads) + "x" + std::to_string(s.head_dim) +
                   (backward ? " backward" : " forward"));
      const size_t n = size_t(s.tokens) * s.heads * s.head_dim;
      auto x = random(n);
      auto pos = positions(s.tokens);
      auto freq = inv_freq(s.head_dim);
      auto gx = upload(x), gp = upload(pos), gf = upload(freq);
      if (backward)
        ops::rope_backward(ctx(), gx, gp, gf, s.tokens, s.heads, s.head_dim);
      else
        ops::rope_forward(ctx(), gx, gp, gf, s.tokens, s.heads, s.head_dim);
      std::vector<double> y(n), xd = to_double(x), fd = to_double(freq);
      if (backward)
        ref::rope_backward(y.data(), xd.data(), pos.data(), fd.data(), s.tokens, s.heads, s.head_dim);
      else
        ref::rope_forward(y.data(), xd.data(), pos.data(), fd.data(), s.tokens, s.heads, s.head_dim);
      expect_close(result(gx, n), y, 2e-6);
    }
  }
}

// Backward after forward gives the input back (the rotation is orthogonal), also for a table
// with inv_freq[0] = 1 at the largest positions.
TEST_F(RopeTest, BackwardUndoesForward) {
  const uint32_t tokens = 11, heads = 3, head_dim = 128;
  const size_t n = size_t(tokens) * heads * head_dim;
  auto x = random(n);
  auto gx = upload(x), gp = upload(positions(tokens)), gf = upload(inv_freq(head_dim, 10000.0));
  ops::rope_forward(ctx(), gx, gp, gf, tokens, heads, head_dim);
  ops::rope_backward(ctx(), gx, gp, gf, tokens, heads, head_dim);
  expect_close(result(gx, n), to_double(x), 2e-6);
}

// x larger than the binding limit goes through several token chunks. Only where the limit is
// small enough to test quickly (lavapipe: 128 MiB). x is filled with ones on the GPU; random
// tokens go around the first chunk's end and at both ends, and only those are read back.
TEST_F(RopeTest, SplitsAtTheBindingLimit) {
  const uint64_t limit = ctx().info().max_storage_buffer_range;
  if (limit > (256ull << 20)) GTEST_SKIP() << "binding limit " << limit << " too large to exceed quickly";
  const uint32_t heads = 37, head_dim = 128;
  const uint64_t row_bytes = uint64_t(heads) * head_dim * 4, row = row_bytes / 4;  // one token
  const auto boundary = static_cast<uint32_t>(limit / row_bytes), tokens = boundary + 3;
  gpu::Buffer gx = ctx().alloc(tokens * row_bytes + kPad * 4, "large rope input");
  bufs_.push_back(gx);
  ctx().fill(gx, 0x3f800000u);  // 1.0f
  ctx().upload(gx.slice(tokens * row_bytes, kPad * 4), std::vector<float>(kPad, kSentinel));
  const std::vector<uint32_t> picked = {0, boundary - 3, boundary - 2, boundary - 1, boundary, boundary + 1, tokens - 1};
  std::vector<float> x;  // the picked tokens, [picked, heads, head_dim]
  for (uint32_t t : picked) {
    auto r = random(row);
    ctx().upload(gx.slice(t * row_bytes, row_bytes), r);
    x.insert(x.end(), r.begin(), r.end());
  }
  auto pos = positions(tokens);
  auto freq = inv_freq(head_dim);
  auto gp = upload(pos), gf = upload(freq);
  ops::rope_forward(ctx(), gx, gp, gf, tokens, heads, head_dim);

  std::vector<int32_t> picked_pos;
  for (uint32_t t : picked) picked_pos.push_back(pos[t]);
  std::vector<double> y(x.size()), xd = to_double(x), fd = to_double(freq);
  ref::rope_forward(y.data(), xd.data(), picked_pos.data(), fd.data(), int64_t(picked.size()), heads, head_dim);
  std::vector<float> got;
  for (uint32_t t : picked) {
    std::vector<float> r(row);
    ctx().download(gx.slice(t * row_bytes, row_bytes), r.data(), row_bytes);
    got.insert(got.end(), r.begin(), r.end());
  }
  expect_close(got, y, 2e-6);
  EXPECT_EQ(ctx().download<float>(gx.slice(tokens * row_bytes, kPad * 4), kPad), std::vector<float>(kPad, kSentinel))
      << "write past the end";
}

// The q/k norm kernels' shapes: head_dim 4 to 128, rows that leave the last workgroup part idle.
const Shape kQkNormShapes[] = {{11, 3, 16}, {11, 3, 128}, {1, 1, 4}, {300, 3, 128}, {7, 16, 64}, {5, 7, 96}};

// Qwen3's q/k norm, RoPE and fp16 rounding in one pass against the double-precision rmsnorm then
// RoPE: each value within an fp16 ulp (plus the fp32 rounding before it), rstd to 1e-5, nothing
// written past the outputs; head_dim 4 to 128, rows that leave the last workgroup part idle.
TEST_F(RopeTest, QkNormRopeF16MatchesNormThenRope) {
  const float eps = 1e-6f;
  for (Shape s : kQkNormShapes) {
    SCOPED_TRACE(std::to_string(s.tokens) + "x" + std::to_string(s.heads) + "x" + std::to_string(s.head_dim));
    const size_t rows = size_t(s.tokens) * s.heads, n = rows * s.head_dim;
    auto x = random(n), w = random(s.head_dim);
    auto pos = positions(s.tokens);
    auto freq = inv_freq(s.head_dim);
    auto gx = upload(x), gw = upload(w), gp = upload(pos), gf = upload(freq);
    const uint16_t sentinel = 0x7e00;
    gpu::Buffer gout = ctx().alloc(n * 2 + 16), grstd = upload(std::vector<float>(rows, 0.0f));
    bufs_.push_back(gout);
    ctx().upload(gout, std::vector<uint16_t>(n + 8, sentinel));
    ops::qk_norm_rope_f16(ctx(), gx, gw, gout, grstd, gp, gf, s.tokens, s.heads, s.head_dim, eps);
    std::vector<double> normed(n), rstd(rows), y(n), xd = to_double(x), wd = to_double(w), fd = to_double(freq);
    ref::rmsnorm_forward(normed.data(), rstd.data(), xd.data(), wd.data(), int64_t(rows), s.head_dim, eps);
    ref::rope_forward(y.data(), normed.data(), pos.data(), fd.data(), s.tokens, s.heads, s.head_dim);
    expect_close(result(grstd, rows), rstd, 1e-5);
    // one row of n values and 8 sentinels; 1e-5 for fp32's error on the rotation's cancelling terms
    const F16Block block{1, static_cast<uint32_t>(n), static_cast<uint32_t>(n)};
    expect_f16_block(ctx().download<uint16_t>(gout, block.halves()), block, y, sentinel, 1e-5);
  }
  auto b = upload(std::vector<float>(64)), gp = upload(std::vector<int32_t>(2));
  EXPECT_THROW(ops::qk_norm_rope_f16(ctx(), b, b, b, b, gp, b, 2, 1, 6, eps), std::logic_error);  // head_dim % 4
}

// Its backward into an fp16 block (rows of ld halves, the heads side by side) against the
// double-precision RoPE backward then rmsnorm backward: each value within an fp16 ulp (plus the
// fp32 rounding before it), the columns past the heads and everything after untouched; head_dim 4
// to 128, rows that leave the last workgroup part idle. The references are the ones the
// finite-difference checks of tests/ops_ref cover.
TEST_F(RopeTest, QkNormRopeBackwardF16MatchesRopeThenNormBackward) {
  const double eps = 1e-6;
  for (Shape s : kQkNormShapes) {
    SCOPED_TRACE(std::to_string(s.tokens) + "x" + std::to_string(s.heads) + "x" + std::to_string(s.head_dim));
    const size_t rows = size_t(s.tokens) * s.heads, n = rows * s.head_dim;
    const uint32_t width = s.heads * s.head_dim, ld = width + 6;
    auto x = random(n), w = random(s.head_dim), dy = random(n);
    std::vector<double> normed(n), rstd(rows), xd = to_double(x), wd = to_double(w), fd;
    ref::rmsnorm_forward(normed.data(), rstd.data(), xd.data(), wd.data(), int64_t(rows), s.head_dim, eps);
    const std::vector<float> rstd32(rstd.begin(), rstd.end());
    auto pos = positions(s.tokens);
    auto freq = inv_freq(s.head_dim);
    fd = to_double(freq);
    auto gx = upload(x), gw = upload(w), gdy = upload(dy), gr = upload(rstd32), gp = upload(pos), gf = upload(freq);
    const uint16_t sentinel = 0x7e00;
    const F16Block block{s.tokens, width, ld};
    gpu::Buffer gout = ctx().alloc(block.halves() * 2);
    bufs_.push_back(gout);
    ctx().upload(gout, std::vector<uint16_t>(block.halves(), sentinel));
    ops::qk_norm_rope_backward_f16(ctx(), gdy, gx, gw, gr, gp, gf, gout, ld, s.tokens, s.heads, s.head_dim);
    std::vector<double> g(n), want(n), dyd = to_double(dy), rstd_used(rstd32.begin(), rstd32.end());
    ref::rope_backward(g.data(), dyd.data(), pos.data(), fd.data(), s.tokens, s.heads, s.head_dim);
    ref::rmsnorm_backward(want.data(), g.data(), xd.data(), wd.data(), rstd_used.data(), int64_t(rows), s.head_dim);
    // 2e-5: fp32's error on the rotation's and the norm's cancelling terms at rstd up to ~3
    expect_f16_block(ctx().download<uint16_t>(gout, block.halves()), block, want, sentinel, 2e-5);
    EXPECT_EQ(result(gdy, n), dy) << "dy is read only";
  }
  auto b = upload(std::vector<float>(64)), gp = upload(std::vector<int32_t>(2));
  EXPECT_THROW(ops::qk_norm_rope_backward_f16(ctx(), b, b, b, b, gp, b, b, 6, 2, 1, 6), std::logic_error);  // head_dim % 4
  EXPECT_THROW(ops::qk_norm_rope_backward_f16(ctx(), b, b, b, b, gp, b, b, 6, 2, 1, 8), std::logic_error);  // ld < 8
}

TEST_F(RopeTest, RejectsOddHeadDim) {
  auto gx = upload(std::vector<float>(30)), gp = upload(std::vector<int32_t>(2)), gf = upload(std::vector<float>(4));
  EXPECT_THROW(ops::rope_forward(ctx(), gx, gp, gf, 2, 3, 5), std::logic_error);
  EXPECT_THROW(ops::rope_forward(ctx(), gx, gp, gf, 2, 3, 1000), std::logic_error);
}

}  // namespace
}  // namespace forja::test
