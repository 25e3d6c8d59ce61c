// LoRA dropout kernel: the mask bit for bit against the CPU re-implementation of the hash
// (ops/ref/dropout_ref.h), kept values x / (1 - p), row offsets and accumulation, p = 0 as the
// exact identity, and keep-rate / independence statistics within a few sigma.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/dropout.h"
#include "ops/ref/dropout_ref.h"
#include "support/gpu_buffers.h"

namespace forja::test {
namespace {

class DropoutTest : public GpuBufferTest {
 protected:
  DropoutTest() : GpuBufferTest(7, 0.25f, 2.0f) {}
  // Values of either sign, never zero, so a zero output means a dropped element.
  std::vector<float> nonzero(size_t n) {
    auto v = random(n);
    for (size_t i = 0; i < n; i += 2) v[i] = -v[i];
    return v;
  }
  std::vector<float> run(const ops::DropoutParams& d, const std::vector<float>& x, uint32_t rows, uint32_t cols) {
    auto gx = upload(x), gy = output(x.size());
    ops::dropout_apply(ctx(), d, gx, 0, gy, 0, 0, rows, cols, false);
    return result(gy, x.size());
  }
};

TEST(DropoutKeys, SplitmixKnownAnswerAndDistinctStreams) {
  // splitmix64 seeded with 0 produces 0xe220a8397b1dcdaf first (Vigna's reference code).
  EXPECT_EQ(ops::dropout_mix64(0), 0xe220a8397b1dcdafull);
  EXPECT_NE(ops::dropout_stream(1, 0, 0), ops::dropout_stream(1, 0, 1));
  EXPECT_NE(ops::dropout_stream(1, 0, 0), ops::dropout_stream(1, 1, 0));
  EXPECT_NE(ops::dropout_stream(1, 0, 0), ops::dropout_stream(2, 0, 0));
  const uint64_t s = ops::dropout_stream(3, 4, 5);
  EXPECT_NE(ops::dropout_key(s, 0, 0), ops::dropout_key(s, 0, 1));
  EXPECT_NE(ops::dropout_key(s, 0, 0), ops::dropout_key(s, 1, 0));
}

TEST_F(DropoutTest, MaskMatchesCpuHashBitForBit) {
  struct Case {
    uint32_t rows, cols;
    double p;
  };
  std::mt19937_64 keys(11);
  for (Case c : {Case{1, 1, 0.5}, Case{7, 13, 0.1}, Case{33, 257, 0.25}, Case{300, 1000, 0.9}, Case{5, 4099, 0.05}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " p=" + std::to_string(c.p));
    const size_t n = size_t(c.rows) * c.cols;
    const auto x = nonzero(n);
    const ops::DropoutParams d = ops::dropout_params(c.p, keys());
    const auto y = run(d, x, c.rows, c.cols);
    std::vector<double> mask(n), want(n);
    ref::dropout_mask(mask.data(), d.key, c.p, 0, c.rows, c.cols);
    size_t pattern_misses = 0;
    for (size_t i = 0; i < n; ++i) {
      want[i] = double(x[i]) * mask[i];
      if ((y[i] == 0.0f) != (mask[i] == 0.0) && pattern_misses++ < 5)
        ADD_FAILURE() << "element " << i << ": gpu " << y[i] << ", cpu mask " << mask[i];
    }
    EXPECT_EQ(pattern_misses, 0u);
    expect_close(y, want, 1e-6);
  }
}

TEST_F(DropoutTest, RowChunksOffsetsAndAccumulateReproduceTheWholeMask) {
  const uint32_t rows = 19, cols = 37, row0 = 6, nr = 9;
  const uint64_t x_off = 3 * cols + 1, y_off = 5;  // unaligned element offsets
  const ops::DropoutParams d = ops::dropout_params(0.3, 0x0123456789abcdefull);
  const auto x = nonzero(size_t(rows) * cols + x_off);
  const auto y0 = random(size_t(nr) * cols + y_off);
  std::vector<double> mask(size_t(nr) * cols);
  ref::dropout_mask(mask.data(), d.key, 0.3, row0, nr, cols);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate);
    auto gx = upload(x), gy = upload(y0);
    // rows [row0, row0 + nr) of a [rows, cols] matrix that starts at x_off
    ops::dropout_apply(ctx(), d, gx, x_off + uint64_t(row0) * cols, gy, y_off, row0, nr, cols, accumulate);
    const auto y = result(gy, y0.size());
    std::vector<double> want(y0.begin(), y0.end());
    for (size_t i = 0; i < mask.size(); ++i)
      want[y_off + i] = (accumulate ? double(y0[y_off + i]) : 0.0) + double(x[x_off + row0 * cols + i]) * mask[i];
    expect_close(y, want, 1e-6);
  }
}

TEST_F(DropoutTest, ZeroProbabilityIsExactlyTheIdentity) {
  const uint32_t rows = 17, cols = 129;
  const auto x = nonzero(size_t(rows) * cols);
  const ops::DropoutParams d = ops::dropout_params(0.0, 99);
  EXPECT_EQ(d.threshold, 0u);
  EXPECT_EQ(d.scale, 1.0f);
  EXPECT_EQ(run(d, x, rows, cols), x);
  // in place: y = x
  auto gx = upload(x);
  ops::dropout_apply(ctx(), d, gx, 0, gx, 0, 0, rows, cols, false);
  EXPECT_EQ(result(gx, x.size()), x);
}

TEST_F(DropoutTest, KeepRateAndIndependenceWithinFiveSigma) {
  const uint32_t rows = 512, cols = 1000;
  const size_t n = size_t(rows) * cols;
  const auto x = nonzero(n);
  for (double p : {0.05, 0.1, 0.5}) {
    SCOPED_TRACE(p);
    const uint64_t stream = ops::dropout_stream(1234, 7, 2);
    // q and k of one layer share their input but must get independent masks
    const auto yq = run(ops::dropout_params(p, ops::dropout_key(stream, 3, 0)), x, rows, cols);
    const auto yk = run(ops::dropout_params(p, ops::dropout_key(stream, 3, 1)), x, rows, cols);
    size_t kept = 0, agree = 0;
    for (size_t i = 0; i < n; ++i) {
      kept += yq[i] != 0.0f;
      agree += (yq[i] != 0.0f) == (yk[i] != 0.0f);
    }
    const double sigma_keep = std::sqrt(p * (1 - p) / double(n));
    EXPECT_NEAR(double(kept) / double(n), 1 - p, 5 * sigma_keep);
    const double pa = p * p + (1 - p) * (1 - p);  // agreement of two independent masks
    EXPECT_NEAR(double(agree) / double(n), pa, 5 * std::sqrt(pa * (1 - pa) / double(n)));
    // every column and every row keeps about 1 - p (a hash weak in one coordinate would not)
    size_t worst_col = 0, worst_row = 0;
    double worst_col_dev = 0, worst_row_dev = 0;
    for (uint32_t c = 0; c < cols; ++c) {
      size_t k = 0;
      for (uint32_t r = 0; r < rows; ++r) k += yq[size_t(r) * cols + c] != 0.0f;
      const double dev = std::abs(double(k) / rows - (1 - p)) / std::sqrt(p * (1 - p) / rows);
      if (dev > worst_col_dev) worst_col_dev = dev, worst_col = c;
    }
    for (uint32_t r = 0; r < rows; ++r) {
      size_t k = 0;
      for (uint32_t c = 0; c < cols; ++c) k += yq[size_t(r) * cols + c] != 0.0f;
      const double dev = std::abs(double(k) / cols - (1 - p)) / std::sqrt(p * (1 - p) / cols);
      if (dev > worst_row_dev) worst_row_dev = dev, worst_row = r;
    }
    // max of ~1000 roughly normal deviations: beyond 5.5 sigma has probability ~4e-5
    EXPECT_LT(worst_col_dev, 5.5) << "column " << worst_col;
    EXPECT_LT(worst_row_dev, 5.5) << "row " << worst_row;
  }
}

}  // namespace
}  // namespace forja::test
