// RMSNorm forward and backward against the double-precision reference (ops/ref/rmsnorm_ref.h)
// on awkward shapes, fp32 and fp16 weights, in place, with sentinels after every output.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "io/float16.h"
#include "ops/ref/rmsnorm_ref.h"
#include "ops/rmsnorm.h"
#include "support/gpu_buffers.h"

namespace forja::test {
namespace {

constexpr float kEps = 1e-6f;  // Qwen3's rms_norm_eps

class NormTest : public GpuBufferTest {
 protected:
  NormTest() : GpuBufferTest(7, -2.0f, 2.0f) {}
  // Uploads w in `dtype`; rounds w in place to the values the GPU sees.
  gpu::Buffer upload_weights(std::vector<float>& w, ops::DType dtype) {
    if (dtype == ops::DType::f32) return upload(w);
    std::vector<uint16_t> h(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      h[i] = io::float_to_f16(w[i]);
      w[i] = io::f16_to_float(h[i]);
    }
    gpu::Buffer b = ctx().alloc(h.size() * 2);
    ctx().upload(b, h);
    bufs_.push_back(b);
    return b;
  }
};

struct Shape {
  uint32_t rows, cols;
};
const Shape kShapes[] = {{1, 1}, {7, 13}, {300, 129}, {7, 2560}, {300, 2560}, {1, 129}, {300, 1}};

TEST_F(NormTest, ForwardMatchesReference) {
  for (ops::DType dt : {ops::DType::f32, ops::DType::f16}) {
    for (Shape s : kShapes) {
      SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) + (dt == ops::DType::f16 ? " f16" : " f32"));
      const size_t n = size_t(s.rows) * s.cols;
      auto x = random(n), w = random(s.cols, 0.5f, 1.5f);
      auto gx = upload(x), gw = upload_weights(w, dt), gy = output(n), gr = output(s.rows);
      ops::rmsnorm_forward(ctx(), gx, gw, dt, gy, gr, s.rows, s.cols, kEps);
      std::vector<double> y(n), rstd(s.rows);
      auto xd = to_double(x), wd = to_double(w);
      ref::rmsnorm_forward(y.data(), rstd.data(), xd.data(), wd.data(), s.rows, s.cols, kEps);
      expect_close(result(gy, n), y, 1e-5);
      expect_close(result(gr, s.rows), rstd, 1e-5);
      EXPECT_EQ(result(gx, n), x) << "the input changed";
    }
  }
}

// The fp16-output forward into a strided block: each value within an fp16 ulp of the reference,
// rstd as the fp32 forward's, the columns past cols and everything after untouched, the range
// flag raised only by a y beyond fp16's range.
TEST_F(NormTest, ForwardF16IntoStridedBlock) {
  for (const F16Block& c : {F16Block{1, 2, 2}, F16Block{7, 130, 194}, F16Block{300, 2560, 2624}, F16Block{5, 128, 128}}) {
    SCOPED_TRACE(c.name());
    const size_t n = c.elements(), out_n = c.halves();
    auto x = random(n), w = random(c.cols, 0.5f, 1.5f);
    auto gx = upload(x), gw = upload(w), gr = output(c.rows);
    const uint16_t sentinel = 0x7e00;
    gpu::Buffer gy = ctx().alloc(out_n * 2), flags = ctx().alloc(8);
    bufs_.push_back(gy);
    bufs_.push_back(flags);
    ctx().upload(gy, std::vector<uint16_t>(out_n, sentinel));
    ctx().upload(flags, std::vector<uint32_t>{0, 0});
    const ops::Fp16RangeFlag flag{flags, 1};
    ops::rmsnorm_forward_f16(ctx(), gx, gw, gy, gr, c.rows, c.cols, c.ld, kEps, &flag);
    std::vector<double> y(n), rstd(c.rows);
    auto xd = to_double(x), wd = to_double(w);
    ref::rmsnorm_forward(y.data(), rstd.data(), xd.data(), wd.data(), c.rows, c.cols, kEps);
    expect_close(result(gr, c.rows), rstd, 1e-5);
    EXPECT_EQ(ctx().download<uint32_t>(flags, 2), (std::vector<uint32_t>{0, 0}));
    expect_f16_block(ctx().download<uint16_t>(gy, out_n), c, y, sentinel, 1e-6);
  }
  // A weight of 1e5 puts y beyond 65504: the flag goes up.
  auto gx = upload(random(64)), gw = upload(std::vector<float>(32, 1e5f)), gr = output(2);
  gpu::Buffer gy = ctx().alloc(128), flags = ctx().alloc(4);
  bufs_.push_back(gy);
  bufs_.push_back(flags);
  ctx().upload(flags, std::vector<uint32_t>{0});
  const ops::Fp16RangeFlag flag{flags, 0};
  ops::rmsnorm_forward_f16(ctx(), gx, gw, gy, gr, 2, 32, 32, kEps, &flag);
  EXPECT_NE(ctx().download<uint32_t>(flags, 1)[0], 0u);
  EXPECT_THROW(ops::rmsnorm_forward_f16(ctx(), gx, gw, gy, gr, 2, 31, 32, kEps), std::logic_error);  // odd cols
}

TEST_F(NormTest, ForwardInPlace) {
  const uint32_t rows = 37, cols = 129;
  auto x = random(size_t(rows) * cols), w = random(cols, 0.5f, 1.5f);
  auto gx = upload(x), gw = upload_weights(w, ops::DType::f16), gr = output(rows);
  ops::rmsnorm_forward(ctx(), gx, gw, ops::DType::f16, gx, gr, rows, cols, kEps);
  std::vector<double> y(x.size()), rstd(rows);
  auto xd = to_double(x), wd = to_double(w);
  ref::rmsnorm_forward(y.data(), rstd.data(), xd.data(), wd.data(), rows, cols, kEps);
  expect_close(result(gx, x.size()), y, 1e-5);
  expect_close(result(gr, rows), rstd, 1e-5);
}

// Tiny rows: rstd is dominated by eps, so a kernel that drops eps (or adds it after the sqrt)
// fails here.
TEST_F(NormTest, ForwardEpsMatters) {
  const uint32_t rows = 3, cols = 13;
  auto x = random(size_t(rows) * cols, -1e-3f, 1e-3f), w = random(cols, 0.5f, 1.5f);
  auto gx = upload(x), gw = upload_weights(w, ops::DType::f32), gy = output(x.size()), gr = output(rows);
  ops::rmsnorm_forward(ctx(), gx, gw, ops::DType::f32, gy, gr, rows, cols, kEps);
  std::vector<double> y(x.size()), rstd(rows);
  auto xd = to_double(x), wd = to_double(w);
  ref::rmsnorm_forward(y.data(), rstd.data(), xd.data(), wd.data(), rows, cols, kEps);
  expect_close(result(gy, x.size()), y, 1e-5);
  std::vector<float> got_rstd = result(gr, rows);
  for (uint32_t r = 0; r < rows; ++r) EXPECT_NEAR(got_rstd[r], rstd[r], 1e-5 * rstd[r]);
}

TEST_F(NormTest, BackwardMatchesReference) {
  for (ops::DType dt : {ops::DType::f32, ops::DType::f16}) {
    for (Shape s : kShapes) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) + (dt == ops::DType::f16 ? " f16" : " f32") +
                     (accumulate ? " accumulate" : ""));
        const size_t n = size_t(s.rows) * s.cols;
        auto x = random(n), w = random(s.cols, 0.5f, 1.5f), dy = random(n), residual = random(n);
        auto gx = upload(x), gw = upload_weights(w, dt), gdy = upload(dy), gr = output(s.rows);
        auto gdx = accumulate ? upload(residual) : output(n);
        ops::rmsnorm_forward(ctx(), gx, gw, dt, output(n), gr, s.rows, s.cols, kEps);
        ops::rmsnorm_backward(ctx(), gdy, gx, gw, dt, gr, gdx, s.rows, s.cols, accumulate);
        std::vector<double> rstd(s.rows), y(n), dx(n);
        auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
        ref::rmsnorm_forward(y.data(), rstd.data(), xd.data(), wd.data(), s.rows, s.cols, kEps);
        ref::rmsnorm_backward(dx.data(), dyd.data(), xd.data(), wd.data(), rstd.data(), s.rows, s.cols);
        if (accumulate)
          for (size_t i = 0; i < n; ++i) dx[i] += residual[i];
        expect_close(result(gdx, n), dx, 1e-5);
        EXPECT_EQ(result(gdy, n), dy) << "dy changed";
      }
    }
  }
}

TEST_F(NormTest, BackwardInPlaceOverDy) {
  const uint32_t rows = 11, cols = 2560;
  const size_t n = size_t(rows) * cols;
  auto x = random(n), w = random(cols, 0.5f, 1.5f), dy = random(n);
  auto gx = upload(x), gw = upload_weights(w, ops::DType::f32), gdy = upload(dy), gr = output(rows);
  ops::rmsnorm_forward(ctx(), gx, gw, ops::DType::f32, output(n), gr, rows, cols, kEps);
  ops::rmsnorm_backward(ctx(), gdy, gx, gw, ops::DType::f32, gr, gdy, rows, cols, false);
  std::vector<double> rstd(rows), y(n), dx(n);
  auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
  ref::rmsnorm_forward(y.data(), rstd.data(), xd.data(), wd.data(), rows, cols, kEps);
  ref::rmsnorm_backward(dx.data(), dyd.data(), xd.data(), wd.data(), rstd.data(), rows, cols);
  expect_close(result(gdy, n), dx, 1e-5);
}

// A [rows, cols] tensor larger than the binding limit goes through several dispatches whose
// bindings start at aligned offsets inside a row (cols is odd). Only where the limit is small
// enough to test quickly (lavapipe: 128 MiB). x is filled with ones on the GPU; random rows go
// around the first chunk's end and at both ends, and only those are read back (all of rstd is).
TEST_F(NormTest, ForwardSplitsAtTheBindingLimit) {
  const uint64_t limit = ctx().info().max_storage_buffer_range;
  if (limit > (256ull << 20)) GTEST_SKIP() << "binding limit " << limit << " too large to exceed quickly";
  const uint32_t cols = 2599, boundary = static_cast<uint32_t>(limit / (4ull * cols)), rows = boundary + 5;
  const uint64_t row_bytes = uint64_t(cols) * 4;
  gpu::Buffer gx = ctx().alloc(rows * row_bytes + kPad * 4, "large rmsnorm input");
  bufs_.push_back(gx);
  ctx().fill(gx, 0x3f800000u);  // 1.0f
  ctx().upload(gx.slice(rows * row_bytes, kPad * 4), std::vector<float>(kPad, kSentinel));
  const std::vector<uint32_t> picked = {0, boundary - 3, boundary - 2, boundary - 1, boundary, boundary + 1, rows - 1};
  std::vector<float> x;  // the picked rows, [picked, cols]
  for (uint32_t r : picked) {
    auto row = random(cols);
    ctx().upload(gx.slice(r * row_bytes, row_bytes), row);
    x.insert(x.end(), row.begin(), row.end());
  }
  auto w = random(cols, 0.5f, 1.5f);
  auto gw = upload_weights(w, ops::DType::f16), gr = output(rows);
  ops::rmsnorm_forward(ctx(), gx, gw, ops::DType::f16, gx, gr, rows, cols, kEps);

  const auto k = static_cast<uint32_t>(picked.size());
  std::vector<double> y(x.size()), rstd(k), xd = to_double(x), wd = to_double(w);
  ref::rmsnorm_forward(y.data(), rstd.data(), xd.data(), wd.data(), k, cols, kEps);
  std::vector<float> got;
  for (uint32_t r : picked) {
    std::vector<float> row(cols);
    ctx().download(gx.slice(r * row_bytes, row_bytes), row.data(), row_bytes);
    got.insert(got.end(), row.begin(), row.end());
  }
  expect_close(got, y, 1e-5);
  EXPECT_EQ(ctx().download<float>(gx.slice(rows * row_bytes, kPad * 4), kPad), std::vector<float>(kPad, kSentinel))
      << "write past the end";
  // Every other row is all ones: rstd = 1 / sqrt(1 + eps).
  std::vector<double> want_rstd(rows, 1.0 / std::sqrt(1.0 + kEps));
  for (uint32_t i = 0; i < k; ++i) want_rstd[picked[i]] = rstd[i];
  expect_close(result(gr, rows), want_rstd, 1e-5);
}

TEST_F(NormTest, RejectsBadShapes) {
  auto x = output(10), w = output(5), r = output(2);
  EXPECT_THROW(ops::rmsnorm_forward(ctx(), x, w, ops::DType::f32, x, r, 2, 1000, kEps), std::logic_error);
  EXPECT_THROW(ops::rmsnorm_forward(ctx(), x, w, ops::DType::f32, x, r, 2, 0, kEps), std::logic_error);
  EXPECT_THROW(ops::rmsnorm_backward(ctx(), x, x, w, ops::DType::f32, r, x, 2, 5, true), std::logic_error);
}

}  // namespace
}  // namespace forja::test
