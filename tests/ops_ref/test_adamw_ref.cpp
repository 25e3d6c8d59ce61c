// Tests of the optimizer references: AdamW against a two-step example worked out independently,
// global-norm clipping, and the learning-rate schedules at their boundaries.
#include "ops/ref/adamw_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

namespace forja::ref {
namespace {

TEST(RefAdamW, TwoStepsAgainstHandComputedValues) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-3 (large on purpose: putting eps before the bias
  // correction would change the result in the 3rd digit), weight decay 0.1 (large: decaying after
  // the update instead of before would change the 4th digit).
  //
  // Element 0, step 1, by hand: theta = 0.5 * (1 - 0.01) = 0.495; m = 0.1 * 0.2 = 0.02;
  // v = 0.001 * 0.04 = 4e-5; bc1 = 0.1, bc2 = 0.001; sqrt(v)/sqrt(bc2) = sqrt(0.04) = 0.2;
  // denom = 0.201; theta = 0.495 - (0.1 / 0.1) * 0.02 / 0.201.
  // The remaining values were computed with an independent scalar script (python, same formulas
  // of formats.md 6.2) and printed to 17 digits.
  std::vector<double> theta = {0.5, -1.0}, m(2, 0.0), v(2, 0.0);
  const std::vector<double> g1 = {0.2, -3.0}, g2 = {-0.1, 1.0};
  adamw_step(theta.data(), m.data(), v.data(), g1.data(), 2, 1, 0.1, 0.9, 0.999, 1e-3, 0.1);
  EXPECT_NEAR(theta[0], 0.495 - 0.02 / 0.201, 1e-15);
  EXPECT_NEAR(theta[0], 0.39549751243781095, 1e-15);
  EXPECT_NEAR(theta[1], -0.89003332222592468, 1e-15);
  EXPECT_NEAR(m[1], -0.3, 1e-15);
  EXPECT_NEAR(v[1], 0.009, 1e-15);
  adamw_step(theta.data(), m.data(), v.data(), g2.data(), 2, 2, 0.1, 0.9, 0.999, 1e-3, 0.1);
  EXPECT_NEAR(theta[0], 0.36507624599729116, 1e-15);
  EXPECT_NEAR(theta[1], -0.84112902570541181, 1e-15);
  EXPECT_NEAR(m[0], 0.008, 1e-15);
  EXPECT_NEAR(m[1], -0.17, 1e-15);
  EXPECT_NEAR(v[0], 4.9960000000000057e-05, 1e-18);
  EXPECT_NEAR(v[1], 0.0099910000000000086, 1e-17);
}

TEST(RefAdamW, ZeroGradientOnlyDecays) {
  std::vector<double> theta = {2.0}, m = {0.0}, v = {0.0};
  const std::vector<double> g = {0.0};
  adamw_step(theta.data(), m.data(), v.data(), g.data(), 1, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01);
  EXPECT_DOUBLE_EQ(theta[0], 2.0 * (1.0 - 1e-5));
}

TEST(RefAdamW, RejectsStepZero) {
  std::vector<double> p = {1.0}, m = {0.0}, v = {0.0}, g = {1.0};
  EXPECT_THROW(adamw_step(p.data(), m.data(), v.data(), g.data(), 1, 0, 0.1, 0.9, 0.999, 1e-8, 0),
               std::invalid_argument);
}

TEST(RefClip, ClipsByGlobalNormAndReturnsUnclipped) {
  std::vector<double> a = {3.0}, b = {0.0, 4.0};
  double* bufs[] = {a.data(), b.data()};
  const int64_t sizes[] = {1, 2};
  EXPECT_DOUBLE_EQ(clip_grad_norm(bufs, sizes, 2, 1.0), 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_DOUBLE_EQ(a[0], 3.0 * coef);
  EXPECT_DOUBLE_EQ(b[1], 4.0 * coef);
  EXPECT_EQ(b[0], 0.0);
}

TEST(RefClip, BelowMaxNormIsUntouchedAndGuardApplies) {
  std::vector<double> a = {3.0, 4.0};
  double* bufs[] = {a.data()};
  const int64_t sizes[] = {2};
  EXPECT_DOUBLE_EQ(clip_grad_norm(bufs, sizes, 1, 10.0), 5.0);
  EXPECT_EQ(a, (std::vector<double>{3.0, 4.0}));  // coef clamped to 1
  // max_norm == total: coef = 5 / (5 + 1e-6) < 1, so the guard scales slightly (as torch does).
  EXPECT_DOUBLE_EQ(clip_grad_norm(bufs, sizes, 1, 5.0), 5.0);
  EXPECT_DOUBLE_EQ(a[0], 3.0 * 5.0 / (5.0 + 1e-6));
  EXPECT_LT(a[0], 3.0);
}

TEST(RefSchedule, CosineWithWarmup) {
  const auto f = [](int64_t s) { return lr_multiplier(LrSchedule::cosine, s, 2, 10); };
  EXPECT_EQ(f(0), 0.0);  // step 0 has lr 0 when warmup > 0
  EXPECT_DOUBLE_EQ(f(1), 0.5);
  EXPECT_DOUBLE_EQ(f(2), 1.0);
  EXPECT_NEAR(f(6), 0.5, 1e-15);
  EXPECT_NEAR(f(4), 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-15);
  EXPECT_NEAR(f(10), 0.0, 1e-15);
  // Past the end HF's formula rises again (cos is not clamped): p = 1.25.
  EXPECT_NEAR(f(12), 0.5 * (1 + std::cos(std::numbers::pi * 1.25)), 1e-15);
  EXPECT_DOUBLE_EQ(lr_multiplier(LrSchedule::cosine, 0, 0, 10), 1.0);  // no warmup
  EXPECT_DOUBLE_EQ(lr_multiplier(LrSchedule::cosine, 3, 3, 3), 1.0);   // T == W: max(1, 0)
}

TEST(RefSchedule, Linear) {
  const auto f = [](int64_t s) { return lr_multiplier(LrSchedule::linear, s, 2, 10); };
  EXPECT_EQ(f(0), 0.0);
  EXPECT_DOUBLE_EQ(f(1), 0.5);
  EXPECT_DOUBLE_EQ(f(2), 1.0);
  EXPECT_DOUBLE_EQ(f(6), 0.5);
  EXPECT_DOUBLE_EQ(f(9), 0.125);
  EXPECT_EQ(f(10), 0.0);
  EXPECT_EQ(f(13), 0.0);  // clamped
  EXPECT_DOUBLE_EQ(lr_multiplier(LrSchedule::linear, 0, 0, 4), 1.0);
}

TEST(RefSchedule, ConstantAndConstantWithWarmup) {
  EXPECT_EQ(lr_multiplier(LrSchedule::constant, 0, 5, 10), 1.0);  // HF "constant" ignores warmup
  EXPECT_EQ(lr_multiplier(LrSchedule::constant, 50, 5, 10), 1.0);
  EXPECT_EQ(lr_multiplier(LrSchedule::constant_with_warmup, 0, 4, 10), 0.0);
  EXPECT_DOUBLE_EQ(lr_multiplier(LrSchedule::constant_with_warmup, 3, 4, 10), 0.75);
  EXPECT_EQ(lr_multiplier(LrSchedule::constant_with_warmup, 4, 4, 10), 1.0);
  EXPECT_EQ(lr_multiplier(LrSchedule::constant_with_warmup, 40, 4, 10), 1.0);
}

}  // namespace
}  // namespace forja::ref
