// Elementwise ops and reductions against the double-precision references (ops/ref), on random
// inputs of awkward sizes, with sentinels after every output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <tuple>

#include "io/float16.h"
#include "ops/elementwise.h"
#include "ops/ref/elementwise_ref.h"
#include "ops/ref/swiglu_ref.h"
#include "support/gpu_buffers.h"

namespace forja::test {
namespace {

class ElementwiseTest : public GpuBufferTest {
 protected:
  ElementwiseTest() : GpuBufferTest(42, -4.0f, 4.0f) {}
};

TEST_F(ElementwiseTest, AddScaleSilu) {
  for (size_t n : {1u, 7u, 255u, 257u, 100003u}) {
    SCOPED_TRACE(n);
    auto a = random(n), b = random(n);
    auto ga = upload(a), gb = upload(b), gy = output(n), gs = output(n), gsi = output(n), gdx = output(n);
    ops::add(ctx(), ga, gb, gy, n);
    ops::scale(ctx(), ga, gs, n, -1.75f);
    ops::silu_forward(ctx(), ga, gsi, n);
    ops::silu_backward(ctx(), ga, gb, gdx, n);
    std::vector<double> y(n), s(n), si(n), dx(n);
    auto ad = to_double(a), bd = to_double(b);
    ref::add(y.data(), ad.data(), bd.data(), n);
    ref::scale(s.data(), ad.data(), -1.75, n);
    ref::silu_forward(si.data(), ad.data(), n);
    ref::silu_backward(dx.data(), bd.data(), ad.data(), n);
    expect_close(result(gy, n), y, 1e-6);
    expect_close(result(gs, n), s, 1e-6);
    expect_close(result(gsi, n), si, 1e-5);
    expect_close(result(gdx, n), dx, 1e-5);
  }
}

// Bit-exact against io::float_to_f16 (round to nearest even), including values that round to
// infinity, subnormals, ties and the zero padding after an odd count.
TEST_F(ElementwiseTest, ToF16IsTheCpuRounding) {
  for (size_t n : {1u, 2u, 7u, 100003u}) {
    SCOPED_TRACE(n);
    auto x = random(n);
    const float special[] = {65519.0f, 65520.0f, -1e6f, 3e-8f, -6.1e-5f, 1.0f + 1.0f / 2048.0f, 0.0f};
    for (size_t i = 0; i < n && i < std::size(special); ++i) {
      x[i] = special[i];
    }
    auto gx = upload(x);
    const size_t words = (n + 1) / 2;
    gpu::Buffer gy = upload(std::vector<float>(words + 4, 0.0f));  // sentinel words follow
    std::vector<uint32_t> fill(words + 4, 0xDEADBEEFu);
    ctx().upload(gy, fill);
    ops::to_f16(ctx(), gx, gy, n);
    auto got = ctx().download<uint32_t>(gy, words + 4);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = static_cast<uint16_t>(got[i / 2] >> (16 * (i % 2)));
      ASSERT_EQ(h, io::float_to_f16(x[i])) << "element " << i << " = " << x[i];
    }
    if (n % 2 == 1) {
      EXPECT_EQ(got[n / 2] >> 16, 0u);
    }
    for (size_t i = words; i < words + 4; ++i) {
      EXPECT_EQ(got[i], 0xDEADBEEFu) << "write past the end";
    }
  }
}

// A block of a strided fp32 matrix, scaled and rounded into a block of a strided fp16 one at its
// lead column, zeros before and after it up to its width; everything outside the block untouched.
// Bit-exact against the CPU rounding of the fp32 product scale * x (the kernel multiplies in fp32
// too).
TEST_F(ElementwiseTest, ToF16BlockWritesItsBlockOnly) {
  struct Case {
    uint32_t rows, cols, width, src_ld, src_first, dst_ld, dst_first;
    float scale;
    uint32_t lead = 0;
  };
  const Case cases[] = {{5, 3, 8, 7, 2, 12, 4, 1.0f},   {1, 16, 16, 16, 0, 16, 0, 2.0f},
                        {33, 16, 64, 48, 16, 130, 66, -0.5f}, {7, 0, 6, 5, 0, 10, 2, 1.0f},
                        {300, 37, 38, 37, 0, 38, 0, 3.0f},    {9, 12, 20, 16, 4, 24, 8, 1.5f},
                        {3, 8, 8, 8, 0, 8, 0, 1.0f},  // the last two: four halves per invocation
                        // narrow blocks, several rows to a workgroup (the last one partly idle)
                        {1001, 16, 64, 16, 0, 80, 16, 0.5f}, {517, 5, 6, 7, 3, 10, 2, 1.0f},
                        {70, 0, 64, 4, 0, 64, 0, 1.0f},      {129, 300, 600, 301, 1, 602, 2, 1.0f},
                        {257, 2, 2, 2, 0, 2, 0, 2.0f},
                        // a factor among others' columns (the folded products' pads): four halves
                        // per invocation, two, an odd lead, a lead past the source's start
                        {65, 16, 64, 48, 16, 2624, 2560, 1.0f, 16}, {31, 16, 64, 48, 32, 130, 66, 2.0f, 32},
                        {9, 5, 12, 7, 3, 16, 2, 1.0f, 3},         {40, 16, 48, 16, 0, 64, 16, -1.0f, 32}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " -> width " + std::to_string(c.width) +
                 " at " + std::to_string(c.lead));
    const size_t src_n = size_t(c.src_first) + size_t(c.rows) * c.src_ld + 4;
    const auto x = random(src_n);
    auto gx = upload(x);
    const size_t dst_n = size_t(c.dst_first) + size_t(c.rows) * c.dst_ld + 8;
    const uint16_t sentinel = 0x7e00;
    std::vector<uint16_t> init(dst_n, sentinel);
    gpu::Buffer gy = ctx().alloc(dst_n * 2);
    ctx().upload(gy, init);
    ops::to_f16_block(ctx(), gx, c.src_first, c.src_ld, gy, c.dst_first, c.dst_ld, c.rows, c.cols, c.width, c.scale,
                      nullptr, c.lead);
    const auto got = ctx().download<uint16_t>(gy, dst_n);
    size_t bad = 0;
    for (size_t e = 0; e < dst_n; ++e) {
      uint16_t want = sentinel;
      if (e >= c.dst_first) {
        const size_t r = (e - c.dst_first) / c.dst_ld, col = (e - c.dst_first) % c.dst_ld;
        if (r < c.rows && col < c.width)
          want = col >= c.lead && col < c.lead + c.cols
                     ? io::float_to_f16(c.scale * x[c.src_first + r * c.src_ld + col - c.lead])
                     : uint16_t(0);
      }
      if (got[e] != want && bad++ < 5) ADD_FAILURE() << "half " << e << ": " << got[e] << ", want " << want;
    }
    EXPECT_EQ(bad, 0u);
    ctx().free(gy);
  }
  gpu::Buffer g = ctx().alloc(1024);
  EXPECT_THROW(ops::to_f16_block(ctx(), g, 0, 4, g, 1, 8, 2, 4, 4), std::logic_error);  // odd offset
  EXPECT_THROW(ops::to_f16_block(ctx(), g, 0, 4, g, 0, 8, 2, 6, 4), std::logic_error);  // cols > width
  EXPECT_THROW(ops::to_f16_block(ctx(), g, 0, 4, g, 0, 8, 2, 2, 4, 1.0f, nullptr, 3), std::logic_error);  // past width
  EXPECT_THROW(ops::to_f16_block(ctx(), g, 0, 4, g, 0, 8, 200, 4, 4), std::logic_error);  // past the end
  ctx().free(g);
}

// The range check of mixed precision: the flag is raised by a finite value that rounds to an fp16
// infinity (|x| >= 65520, after the block's scale), by no other (65519 rounds to 65504; fp32
// infinities and NaN are not fp16's doing), and only ever raised: the other flags stay as they were.
TEST_F(ElementwiseTest, Fp16RangeFlagIsRaisedOnlyBeyondFp16) {
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<float> x;
    float scale;
    bool beyond;
  };
  const Case cases[] = {{{1.0f, -65519.0f, 65504.0f, 3.0f}, 1.0f, false},
                        {{1.0f, 2.0f, -65520.0f, 0.5f}, 1.0f, true},
                        {{inf, -inf, std::nanf(""), 7.0f}, 1.0f, false},
                        {{1.0f, 40000.0f, 2.0f, 3.0f}, 2.0f, true},
                        {{1.0f, 1e30f, 2.0f, 3.0f}, 1.0f, true}};
  gpu::Buffer flags = ctx().alloc(16);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.x[1]) + " scale " + std::to_string(c.scale));
    for (int mode : {0, 1, 2}) {  // to_f16; to_f16_block two halves, then four halves per invocation
      const bool block = mode > 0;
      if (!block && c.scale != 1.0f) continue;  // to_f16 has no scale
      ctx().upload(flags, std::vector<uint32_t>{5u, 0u, 0u, 0u});
      auto gx = upload(c.x);
      gpu::Buffer gy = ctx().alloc(64);
      const ops::Fp16RangeFlag flag{flags, 2};
      if (mode == 1)
        ops::to_f16_block(ctx(), gx, 0, 2, gy, 0, 4, 2, 2, 4, c.scale, &flag);
      else if (mode == 2)
        ops::to_f16_block(ctx(), gx, 0, 4, gy, 0, 4, 1, 4, 4, c.scale, &flag);
      else
        ops::to_f16(ctx(), gx, gy, c.x.size(), &flag);
      const auto got = ctx().download<uint32_t>(flags, 4);
      EXPECT_EQ(got[0], 5u);
      EXPECT_EQ(got[1], 0u);
      EXPECT_EQ(got[2] != 0, c.beyond) << (block ? "to_f16_block" : "to_f16");
      EXPECT_EQ(got[3], 0u);
      ctx().free(gy);
    }
  }
  ctx().free(flags);
}

TEST_F(ElementwiseTest, InPlaceAdd) {
  const size_t n = 1001;
  auto a = random(n), b = random(n);
  auto ga = upload(a), gb = upload(b);
  ops::add(ctx(), ga, gb, ga, n);
  std::vector<double> y(n);
  auto ad = to_double(a), bd = to_double(b);
  ref::add(y.data(), ad.data(), bd.data(), n);
  expect_close(result(ga, n), y, 1e-6);
}

TEST_F(ElementwiseTest, SwigluForwardBackward) {
  for (size_t n : {1u, 33u, 4099u}) {
    SCOPED_TRACE(n);
    auto g = random(n), u = random(n), dh = random(n);
    auto gg = upload(g), gu = upload(u), gdh = upload(dh), gh = output(n), gdg = output(n), gdu = output(n);
    ops::swiglu_forward(ctx(), gg, gu, gh, n);
    ops::swiglu_backward(ctx(), gg, gu, gdh, gdg, gdu, n);
    auto gd = to_double(g), ud = to_double(u), dhd = to_double(dh);
    std::vector<double> h(n), dg(n), du(n);
    ref::swiglu_forward(h.data(), gd.data(), ud.data(), n);
    ref::swiglu_backward(dg.data(), du.data(), dhd.data(), gd.data(), ud.data(), n);
    expect_close(result(gh, n), h, 1e-5);
    expect_close(result(gdg, n), dg, 1e-5);
    expect_close(result(gdu, n), du, 1e-5);
  }
}

// The fp16 variants into strided blocks (down's input; gate's and up's dy): each value the double
// reference rounded to fp16 (within an ulp of fp16: the fp32 arithmetic before the rounding may
// land on the other side of a rounding boundary), the columns past cols and everything after
// untouched; the forward's range flag raised only by an h beyond fp16's range.
TEST_F(ElementwiseTest, SwigluF16IntoStridedBlocks) {
  for (const F16Block& c : {F16Block{1, 2, 2}, F16Block{7, 34, 40}, F16Block{300, 130, 194}, F16Block{3, 4098, 4162}}) {
    SCOPED_TRACE(c.name());
    const size_t n = c.elements(), out_n = c.halves();
    auto g = random(n), u = random(n), dh = random(n);
    auto gg = upload(g), gu = upload(u), gdh = upload(dh);
    const uint16_t sentinel = 0x7e00;
    std::vector<gpu::Buffer> outs;
    for (int i = 0; i < 3; ++i) {
      outs.push_back(ctx().alloc(out_n * 2));
      ctx().upload(outs.back(), std::vector<uint16_t>(out_n, sentinel));
    }
    gpu::Buffer flags = ctx().alloc(8);
    ctx().upload(flags, std::vector<uint32_t>{0, 0});
    const ops::Fp16RangeFlag flag{flags, 1};
    ops::swiglu_forward_f16(ctx(), gg, gu, outs[0], c.rows, c.cols, c.ld, &flag);
    ops::swiglu_backward_f16(ctx(), gg, gu, gdh, outs[1], outs[2], c.rows, c.cols, c.ld);
    EXPECT_EQ(ctx().download<uint32_t>(flags, 2), (std::vector<uint32_t>{0, 0}));
    std::vector<double> h(n), dg(n), du(n);
    auto gd = to_double(g), ud = to_double(u), dhd = to_double(dh);
    ref::swiglu_forward(h.data(), gd.data(), ud.data(), n);
    ref::swiglu_backward(dg.data(), du.data(), dhd.data(), gd.data(), ud.data(), n);
    const std::tuple<gpu::Buffer*, std::vector<double>*, const char*> checks[] = {
        {&outs[0], &h, "h"}, {&outs[1], &dg, "dg"}, {&outs[2], &du, "du"}};
    for (const auto& [buffer, want, name] : checks)
      expect_f16_block(ctx().download<uint16_t>(*buffer, out_n), c, *want, sentinel, 1.0 / (1 << 24), name);
    for (const gpu::Buffer& b : outs) ctx().free(b);
    ctx().free(flags);
  }
  // h = 300 silu(300) = 90000 rounds to fp16's infinity: the flag goes up.
  auto big = upload(std::vector<float>(8, 300.0f));
  gpu::Buffer h16 = ctx().alloc(16), flags = ctx().alloc(4);
  ctx().upload(flags, std::vector<uint32_t>{0});
  const ops::Fp16RangeFlag flag{flags, 0};
  ops::swiglu_forward_f16(ctx(), big, big, h16, 2, 4, 4, &flag);
  EXPECT_NE(ctx().download<uint32_t>(flags, 1)[0], 0u);
  gpu::Buffer b = upload(std::vector<float>(64));
  EXPECT_THROW(ops::swiglu_backward_f16(ctx(), b, b, b, b, b, 2, 3, 4), std::logic_error);  // odd cols
  EXPECT_THROW(ops::swiglu_forward_f16(ctx(), b, b, b, 2, 8, 6), std::logic_error);         // cols > ld
}

TEST_F(ElementwiseTest, RowReductions) {
  struct Shape {
    uint32_t rows, cols;
  };
  for (Shape s : {Shape{1, 1}, Shape{3, 777}, Shape{70, 13}, Shape{2, 4100}}) {
    SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols));
    auto x = random(size_t(s.rows) * s.cols);
    auto gx = upload(x), gsum = output(s.rows), gsq = output(s.rows), gmax = output(s.rows);
    ops::row_sum(ctx(), gx, gsum, s.rows, s.cols);
    ops::row_sum_squares(ctx(), gx, gsq, s.rows, s.cols);
    ops::row_max(ctx(), gx, gmax, s.rows, s.cols);
    auto xd = to_double(x);
    std::vector<double> sum(s.rows), sq(s.rows), mx(s.rows);
    ref::row_sum(sum.data(), xd.data(), s.rows, s.cols);
    ref::row_sum_squares(sq.data(), xd.data(), s.rows, s.cols);
    ref::row_max(mx.data(), xd.data(), s.rows, s.cols);
    expect_close(result(gsum, s.rows), sum, 1e-5);
    expect_close(result(gsq, s.rows), sq, 1e-5);
    expect_close(result(gmax, s.rows), mx, 0.0);
  }
}

TEST_F(ElementwiseTest, GlobalL2NormOverManyBuffers) {
  std::vector<std::vector<float>> host;
  std::vector<ops::VectorRef> refs;
  for (size_t n : {1u, 17u, 4096u, 300001u, 5u}) {
    host.push_back(random(n, -0.01f, 0.01f));
    refs.push_back({upload(host.back()), n});
  }
  auto out = output(1);
  ops::global_l2_norm(ctx(), refs, out);
  std::vector<std::vector<double>> hd;
  std::vector<const double*> ptrs;
  std::vector<int64_t> sizes;
  for (auto& h : host) hd.push_back(to_double(h));
  for (auto& h : hd) {
    ptrs.push_back(h.data());
    sizes.push_back(static_cast<int64_t>(h.size()));
  }
  double want = ref::global_l2_norm(ptrs.data(), sizes.data(), static_cast<int64_t>(ptrs.size()));
  expect_close(result(out, 1), {want}, 1e-5);
}

}  // namespace
}  // namespace forja::test
