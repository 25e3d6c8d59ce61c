// Tests of the RMSNorm and RoPE references.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/ref/rmsnorm_ref.h"
#include "ops/ref/rope_ref.h"
#include "ops_ref/fd_check.h"

namespace forja::ref {
namespace {

using test::fd_check;
using test::random_vec;

TEST(RefRmsnorm, ForwardValues) {
  // Row [3, 4]: mean square 12.5; eps 0.5 -> rstd = 1/sqrt(13).
  const std::vector<double> x = {3, 4}, w = {2, -1};
  std::vector<double> y(2), rstd(1);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), 1, 2, 0.5);
  const double r = 1.0 / std::sqrt(13.0);
  EXPECT_NEAR(rstd[0], r, 1e-15);
  EXPECT_NEAR(y[0], 6 * r, 1e-15);
  EXPECT_NEAR(y[1], -4 * r, 1e-15);
}

void check_rmsnorm_backward(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double eps = 1e-6;
  std::vector<double> x = random_vec(rng, rows * cols, -2, 2);
  std::vector<double> w = random_vec(rng, cols, 0.5, 1.5);
  const std::vector<double> dy = random_vec(rng, rows * cols);
  std::vector<double> y(rows * cols), rstd(rows), dx(rows * cols), dw(cols, 0.0);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, cols, eps);
  rmsnorm_backward(dx.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, cols);
  rmsnorm_backward_dw(dw.data(), dy.data(), x.data(), rstd.data(), rows, cols);
  auto loss = [&] {
    rmsnorm_forward(y.data(), nullptr, x.data(), w.data(), rows, cols, eps);
    return test::dot(dy, y);
  };
  EXPECT_FD_OK(fd_check(x, dx, loss));
  EXPECT_FD_OK(fd_check(w, dw, loss));
}

TEST(RefRmsnorm, BackwardMatchesFiniteDifferencesHidden) { check_rmsnorm_backward(7, 13, 10); }

TEST(RefRmsnorm, BackwardMatchesFiniteDifferencesPerHead) {
  // The q/k norm view: rows = tokens * heads = 11 * 3, cols = head_dim = 6.
  check_rmsnorm_backward(11 * 3, 6, 11);
}

TEST(RefRmsnorm, DwAccumulatesAndDxMayAliasDy) {
  std::mt19937_64 rng(12);
  const int64_t rows = 5, cols = 9;
  const std::vector<double> x = random_vec(rng, rows * cols), w = random_vec(rng, cols);
  std::vector<double> dy = random_vec(rng, rows * cols);
  std::vector<double> y(rows * cols), rstd(rows), dx(rows * cols);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-5);
  std::vector<double> dw(cols, 1.0), dw_once(cols, 0.0);
  rmsnorm_backward_dw(dw_once.data(), dy.data(), x.data(), rstd.data(), rows, cols);
  rmsnorm_backward_dw(dw.data(), dy.data(), x.data(), rstd.data(), rows, cols);
  for (int64_t c = 0; c < cols; ++c) EXPECT_DOUBLE_EQ(dw[c], 1.0 + dw_once[c]);
  rmsnorm_backward(dx.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, cols);
  rmsnorm_backward(dy.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, cols);
  EXPECT_EQ(dx, dy);
}

TEST(RefRope, ScalarFormulaHalfSplit) {
  // One token, one head, d = 4: pairs (0, 2) and (1, 3).
  const std::vector<double> x = {1.0, 2.0, 3.0, 4.0}, inv_freq = {0.5, 0.25};
  const std::vector<int32_t> pos = {3};
  std::vector<double> y(4);
  rope_forward(y.data(), x.data(), pos.data(), inv_freq.data(), 1, 1, 4);
  const double a0 = 1.5, a1 = 0.75;  // exact in fp32
  EXPECT_NEAR(y[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-15);
  EXPECT_NEAR(y[2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-15);
  EXPECT_NEAR(y[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-15);
  EXPECT_NEAR(y[3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-15);
}

TEST(RefRope, AngleIsRoundedToFloat32) {
  // 0.1 is not a float; at position 123457 the fp32 angle differs from the exact product by
  // ~1e-4 rad, so a double-angle implementation fails this by far.
  const std::vector<double> x = {1.0, 0.0}, inv_freq = {0.1};
  const std::vector<int32_t> pos = {123457};
  std::vector<double> y(2);
  rope_forward(y.data(), x.data(), pos.data(), inv_freq.data(), 1, 1, 2);
  const float a32 = 123457.0f * 0.1f;
  EXPECT_NEAR(y[0], std::cos(static_cast<double>(a32)), 1e-14);
  EXPECT_NEAR(y[1], std::sin(static_cast<double>(a32)), 1e-14);
  EXPECT_GT(std::fabs(y[0] - std::cos(123457.0 * 0.1)), 1e-6);
}

TEST(RefRope, InvFreqDefault) {
  std::vector<double> inv(64);
  rope_inv_freq_default(inv.data(), 128, 1e6);
  EXPECT_EQ(inv[0], 1.0);
  for (int j = 0; j < 64; ++j) {
    const double want = 1.0 / std::pow(1e6, 2.0 * j / 128.0);
    EXPECT_NEAR(inv[j], want, want * 2e-7) << j;                         // fp32-rounded
    EXPECT_EQ(inv[j], static_cast<double>(static_cast<float>(inv[j])));  // exactly a float
  }
}

TEST(RefRope, PreservesPairNormsAndBackwardInvertsForward) {
  std::mt19937_64 rng(13);
  const int64_t tokens = 11, heads = 3, d = 6;
  std::vector<double> inv(d / 2);
  rope_inv_freq_default(inv.data(), d, 10000.0);
  std::vector<int32_t> pos(tokens);
  for (int64_t t = 0; t < tokens; ++t) pos[t] = static_cast<int32_t>(t * 977);
  const std::vector<double> x = random_vec(rng, tokens * heads * d);
  std::vector<double> y(x.size()), back(x.size());
  rope_forward(y.data(), x.data(), pos.data(), inv.data(), tokens, heads, d);
  for (int64_t r = 0; r < tokens * heads; ++r) {
    for (int64_t j = 0; j < d / 2; ++j) {
      const double nx = std::hypot(x[r * d + j], x[r * d + j + d / 2]);
      EXPECT_NEAR(std::hypot(y[r * d + j], y[r * d + j + d / 2]), nx, 1e-14);
    }
  }
  rope_backward(back.data(), y.data(), pos.data(), inv.data(), tokens, heads, d);
  EXPECT_LT(test::max_rel_diff(back, x), 1e-14);
  std::vector<double> inplace = x;
  rope_forward(inplace.data(), inplace.data(), pos.data(), inv.data(), tokens, heads, d);
  EXPECT_EQ(inplace, y);
}

TEST(RefRope, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(14);
  const int64_t tokens = 11, heads = 3, d = 6;
  const std::vector<double> inv = {1.0, 0.1, 0.01};
  std::vector<int32_t> pos(tokens);
  for (int64_t t = 0; t < tokens; ++t) pos[t] = static_cast<int32_t>((t * 5) % 7);  // restarts
  std::vector<double> x = random_vec(rng, tokens * heads * d);
  const std::vector<double> dy = random_vec(rng, x.size());
  std::vector<double> y(x.size()), dx(x.size());
  rope_backward(dx.data(), dy.data(), pos.data(), inv.data(), tokens, heads, d);
  EXPECT_FD_OK(fd_check(x, dx, [&] {
    rope_forward(y.data(), x.data(), pos.data(), inv.data(), tokens, heads, d);
    return test::dot(dy, y);
  }));
}

TEST(RefRope, RejectsOddHeadDim) {
  std::vector<double> x(3), y(3), inv(1);
  const std::vector<int32_t> pos = {0};
  EXPECT_THROW(rope_forward(y.data(), x.data(), pos.data(), inv.data(), 1, 1, 3),
               std::invalid_argument);
}

}  // namespace
}  // namespace forja::ref
