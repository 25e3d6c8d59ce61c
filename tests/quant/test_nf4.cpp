// The NF4 codec (quant/nf4.h): code selection exactly at the midpoint thresholds, bitsandbytes'
// byte layout built by hand, the dequantisation error bound, double quantisation, threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "quant/nf4.h"

namespace forja::quant {
namespace {

TEST(Nf4Code, ThresholdsAreMidpointsOfTheCode) {
  for (int i = 0; i < 15; ++i) {
    double mid = (static_cast<double>(kNf4Code[i]) + kNf4Code[i + 1]) / 2;
    EXPECT_NEAR(kNf4Thresholds[i], mid, 1e-7) << i;
    EXPECT_LT(kNf4Code[i], kNf4Thresholds[i]);
    EXPECT_GT(kNf4Code[i + 1], kNf4Thresholds[i]);
  }
}

TEST(Nf4Code, SelectionAtEachThreshold) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 15; ++i) {
    const float t = kNf4Thresholds[i];
    EXPECT_EQ(nf4_index(std::nextafter(t, -inf)), i) << "just below threshold " << i;
    EXPECT_EQ(nf4_index(t), i) << "exactly on threshold " << i << " goes to the lower code";
    EXPECT_EQ(nf4_index(std::nextafter(t, inf)), i + 1) << "just above threshold " << i;
  }
  for (int i = 0; i < 16; ++i) EXPECT_EQ(nf4_index(kNf4Code[i]), i) << "code value " << i;
  EXPECT_EQ(nf4_index(-1.5f), 0);
  EXPECT_EQ(nf4_index(1.5f), 15);
  EXPECT_EQ(nf4_index(std::numeric_limits<float>::quiet_NaN()), 0);  // as the CUDA tree
}

TEST(Nf4Code, SelectionIsNearestCode) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int n = 0; n < 100000; ++n) {
    float x = u(rng);
    int best = 0;
    for (int i = 1; i < 16; ++i)
      if (std::fabs(x - kNf4Code[i]) < std::fabs(x - kNf4Code[best])) best = i;
    ASSERT_EQ(nf4_index(x), best) << x;
  }
}

TEST(Nf4Layout, MatchesBitsandbytesBytesByHand) {
  // 5 elements (odd), absmax 2: scaled 0.5, -1, 0, 0.25, 0.05
  //   0.5  -> between 0.4407 (12) and 0.5626 (13), threshold 0.5017 -> 12
  //   -1   -> 0;  0 -> 7;  0.25 -> threshold 0.2920 above, 0.2035 below -> 10
  //   0.05 -> threshold 0.0398 below, 0.1203 above -> 8; padding element 0.0 -> 7
  std::vector<float> w = {1.0f, -2.0f, 0.0f, 0.5f, 0.1f};
  Nf4Tensor t = nf4_quantize(w, {5}, {.double_quant = false, .threads = 1});
  ASSERT_EQ(t.packed.size(), 3u);
  EXPECT_EQ(t.packed[0], (12 << 4) | 0);
  EXPECT_EQ(t.packed[1], (7 << 4) | 10);
  EXPECT_EQ(t.packed[2], (8 << 4) | 7);
  ASSERT_EQ(t.absmax.size(), 1u);
  EXPECT_EQ(t.absmax[0], 2.0f);
  EXPECT_FALSE(t.double_quant);
}

TEST(Nf4Layout, BlocksOf64InRowMajorOrder) {
  // Shape [3, 50] = 150 elements = blocks of 64, 64, 22. Block b is all equal to (b + 1), with
  // element 0 of each block negated: its absmax is b + 1, codes are 0 then 15.
  std::vector<float> w(150);
  for (int e = 0; e < 150; ++e)
    w[e] = static_cast<float>(e / 64 + 1) * (e % 64 == 0 ? -1.0f : 1.0f);
  Nf4Tensor t = nf4_quantize(w, {3, 50}, {.double_quant = false, .threads = 1});
  ASSERT_EQ(t.num_blocks(), 3);
  EXPECT_EQ(t.absmax, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(t.packed.size(), 75u);
  for (int k = 0; k < 75; ++k) {
    int e = 2 * k;
    std::uint8_t hi = (e % 64 == 0) ? 0 : 15;
    EXPECT_EQ(t.packed[k], (hi << 4) | 15) << "byte " << k;
  }
}

TEST(Nf4Layout, ZeroBlockDequantisesToZero) {
  std::vector<float> w(128, 0.0f);
  w[100] = 3.0f;
  Nf4Tensor t = nf4_quantize(w, {128}, {.double_quant = false, .threads = 1});
  EXPECT_EQ(t.absmax[0], 0.0f);
  EXPECT_EQ(t.packed[0], 0x00);  // NaN scaled values take code 0 in bitsandbytes' kernel
  auto d = nf4_dequantize(t);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(d[i], 0.0f);
  EXPECT_EQ(d[100], 3.0f);
}

// Largest gap between adjacent codes: the worst-case rounding is half of it, times absmax.
float half_largest_gap() {
  float g = 0;
  for (int i = 0; i < 15; ++i) g = std::max(g, kNf4Code[i + 1] - kNf4Code[i]);
  return g / 2;
}

TEST(Nf4Quantize, DequantiseErrorBound) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int rows = 37, cols = 129;  // odd element count, partial last block
  std::vector<float> w(rows * cols);
  for (float& x : w) x = normal(rng);
  w[5] = 0.5f;  // an outlier
  Nf4Tensor t = nf4_quantize(w, {rows, cols}, {.double_quant = false, .threads = 3});
  auto d = nf4_dequantize(t);
  const float h = half_largest_gap();
  double err_sum = 0;
  for (std::size_t e = 0; e < w.size(); ++e) {
    float a = t.absmax[e / 64];
    ASSERT_LE(std::fabs(w[e] - d[e]), h * a * (1 + 1e-6f)) << e;
    // The chosen code is the nearest one to the scaled value.
    float s = w[e] / a;
    float best = 2;
    for (float c : kNf4Code) best = std::min(best, std::fabs(s - c));
    ASSERT_NEAR(std::fabs(s - d[e] / a), best, 1e-6f) << e;
    err_sum += std::fabs(w[e] - d[e]);
  }
  EXPECT_LT(err_sum / w.size(), 0.1 * 0.02);  // typical error well under the bound
}

TEST(Nf4DoubleQuant, DynamicMapShape) {
  const auto& m = dynamic_map_signed();
  EXPECT_TRUE(std::is_sorted(m.begin(), m.end()));
  EXPECT_EQ(m[127], 0.0f);
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_EQ(m[128], static_cast<float>(1e-6) * 0.55f);  // smallest positive: 1e-6 * mean(0.1, 1)
  EXPECT_EQ(m[126], -m[128]);
  for (int i = 0; i < 127; ++i) EXPECT_EQ(m[i], -m[254 - i]) << i;  // symmetric but for 1.0
  // The top decade has 64 values: means of a 65-point linspace(0.1, 1).
  EXPECT_NEAR(m[254], (1.0 + (1.0 - 0.9 / 64)) / 2, 1e-6);
  EXPECT_NEAR(m[0], -m[254], 0);
}

TEST(Nf4DoubleQuant, DynamicIndexIsNearest) {
  const auto& m = dynamic_map_signed();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int n = 0; n < 20000; ++n) {
    float x = n % 2 ? u(rng) : u(rng) * 1e-3f;
    int got = dynamic_map_index(x);
    float best = 3;
    for (float c : m) best = std::min(best, std::fabs(x - c));
    ASSERT_NEAR(std::fabs(x - m[got]), best, 1e-7f) << x;
  }
  for (int i = 0; i < 256; ++i) {
    // Exact code values map to themselves (0 sits at 127; the duplicate-free map is strictly
    // sorted).
    ASSERT_EQ(dynamic_map_index(m[i]), i) << i;
  }
  EXPECT_EQ(dynamic_map_index(1.0f), 255);
  EXPECT_EQ(dynamic_map_index(-1.0f), 0);
}

TEST(Nf4DoubleQuant, RoundTripErrorBound) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(64 * 600 + 17);  // 601 blocks: 3 nested blocks, the last partial
  for (float& x : w) x = normal(rng);
  Nf4Tensor plain =
      nf4_quantize(w, {static_cast<std::int64_t>(w.size())}, {.double_quant = false, .threads = 2});
  Nf4Tensor dq =
      nf4_quantize(w, {static_cast<std::int64_t>(w.size())}, {.double_quant = true, .threads = 2});
  ASSERT_TRUE(dq.double_quant);
  EXPECT_EQ(dq.packed, plain.packed);  // the 4-bit codes use the exact absmax either way
  ASSERT_EQ(dq.absmax_q.size(), 601u);
  ASSERT_EQ(dq.nested_absmax.size(), 3u);
  double mean = 0;
  for (float a : plain.absmax) mean += a;
  mean /= plain.absmax.size();
  EXPECT_NEAR(dq.absmax_offset, mean, 1e-7);

  // Largest gap of the dynamic map (0.9/64 in the top decade), halved, times the nested absmax.
  const auto& m = dynamic_map_signed();
  float gap = 0;
  for (int i = 0; i < 255; ++i) gap = std::max(gap, m[i + 1] - m[i]);
  for (std::int64_t b = 0; b < dq.num_blocks(); ++b) {
    float nested = dq.nested_absmax[b / 256];
    float exact = plain.absmax[b];
    ASSERT_LE(std::fabs(dq.block_absmax(b) - exact), gap / 2 * nested * (1 + 1e-5f) + 1e-9f) << b;
    // and the nested absmax really is the max |absmax - offset| of its 256 block.
  }
  for (int j = 0; j < 3; ++j) {
    float mx = 0;
    for (int b = j * 256; b < std::min(601, (j + 1) * 256); ++b)
      mx = std::max(mx, std::fabs(plain.absmax[b] - dq.absmax_offset));
    EXPECT_EQ(dq.nested_absmax[j], mx);
  }
  // The whole tensor: NF4 bound with the decoded absmax, plus the absmax error.
  auto d = nf4_dequantize(dq);
  const float h = half_largest_gap();
  for (std::size_t e = 0; e < w.size(); ++e) {
    float a = dq.block_absmax(static_cast<std::int64_t>(e / 64));
    float exact = plain.absmax[e / 64];
    ASSERT_LE(std::fabs(w[e] - d[e]), h * exact + std::fabs(a - exact) + 1e-7f) << e;
  }
  // Storage: 4 bits + 8/64 + 32/(64*256) bits per parameter, plus the offset.
  EXPECT_EQ(dq.storage_bytes(), (w.size() + 1) / 2 + 601 + 3 * 4 + 4);
  EXPECT_EQ(plain.storage_bytes(), (w.size() + 1) / 2 + 601 * 4);
}

TEST(Nf4Quantize, ThreadsGiveIdenticalResults) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(64 * 1000 + 3);
  for (float& x : w) x = normal(rng);
  Nf4Tensor one =
      nf4_quantize(w, {static_cast<std::int64_t>(w.size())}, {.double_quant = true, .threads = 1});
  Nf4Tensor many =
      nf4_quantize(w, {static_cast<std::int64_t>(w.size())}, {.double_quant = true, .threads = 7});
  EXPECT_EQ(one.packed, many.packed);
  EXPECT_EQ(one.absmax_q, many.absmax_q);
  EXPECT_EQ(one.nested_absmax, many.nested_absmax);
}

}  // namespace
}  // namespace forja::quant
