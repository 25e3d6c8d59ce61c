// Tests of the LoRA linear reference.
#include "ops/ref/lora_ref.h"

#include <gtest/gtest.h>

#include <vector>

#include "ops_ref/fd_check.h"

namespace forja::ref {
namespace {

using test::fd_check;
using test::random_vec;

struct LoraCase {
  int64_t tokens = 7, in = 13, out = 5, rank = 3;
  double scaling = 16.0 / 3.0;
  std::vector<double> x, w, bias, a, b, mask;
  explicit LoraCase(uint64_t seed, bool with_dropout) {
    std::mt19937_64 rng(seed);
    x = random_vec(rng, tokens * in);
    w = random_vec(rng, out * in);
    bias = random_vec(rng, out);
    a = random_vec(rng, rank * in);
    b = random_vec(rng, out * rank);  // non-zero B so every path carries gradient
    if (with_dropout) {
      const double p = 0.25;
      std::bernoulli_distribution keep(1 - p);
      mask.resize(tokens * in);
      for (double& m : mask) m = keep(rng) ? 1.0 / (1 - p) : 0.0;
    }
  }
  const double* maskp() const { return mask.empty() ? nullptr : mask.data(); }
};

TEST(RefLora, ForwardEqualsExplicitSums) {
  const LoraCase c(30, true);
  std::vector<double> y(c.tokens * c.out), xa(c.tokens * c.rank);
  lora_forward(y.data(), xa.data(), c.x.data(), c.w.data(), c.bias.data(), c.a.data(), c.b.data(),
               c.maskp(), c.scaling, c.tokens, c.in, c.out, c.rank);
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t o = 0; o < c.out; ++o) {
      double base = c.bias[o], lora = 0.0;
      for (int64_t i = 0; i < c.in; ++i) base += c.x[t * c.in + i] * c.w[o * c.in + i];
      for (int64_t r = 0; r < c.rank; ++r) {
        double ar = 0.0;
        for (int64_t i = 0; i < c.in; ++i) {
          ar += c.x[t * c.in + i] * c.mask[t * c.in + i] * c.a[r * c.in + i];
        }
        if (o == 0) {
          EXPECT_NEAR(xa[t * c.rank + r], ar, 1e-13);
        }
        lora += c.b[o * c.rank + r] * ar;
      }
      EXPECT_NEAR(y[t * c.out + o], base + c.scaling * lora, 1e-12);
    }
  }
}

void check_lora_backward(bool with_dropout, uint64_t seed) {
  LoraCase c(seed, with_dropout);
  const std::vector<double> dy = [&] {
    std::mt19937_64 rng(seed + 1);
    return random_vec(rng, c.tokens * c.out);
  }();
  std::vector<double> dx(c.x.size()), da(c.a.size(), 0.0), db(c.b.size(), 0.0);
  lora_backward(dx.data(), da.data(), db.data(), dy.data(), c.x.data(), c.w.data(), c.a.data(),
                c.b.data(), c.maskp(), c.scaling, c.tokens, c.in, c.out, c.rank);
  std::vector<double> y(c.tokens * c.out);
  auto loss = [&] {
    lora_forward(y.data(), nullptr, c.x.data(), c.w.data(), c.bias.data(), c.a.data(), c.b.data(),
                 c.maskp(), c.scaling, c.tokens, c.in, c.out, c.rank);
    return test::dot(dy, y);
  };
  EXPECT_FD_OK(fd_check(c.x, dx, loss));
  EXPECT_FD_OK(fd_check(c.a, da, loss));
  EXPECT_FD_OK(fd_check(c.b, db, loss));
}

TEST(RefLora, BackwardMatchesFiniteDifferences) { check_lora_backward(false, 31); }
TEST(RefLora, BackwardMatchesFiniteDifferencesWithDropout) { check_lora_backward(true, 32); }

TEST(RefLora, ParameterGradientsAccumulateActivationGradientOverwrites) {
  const LoraCase c(33, false);
  std::mt19937_64 rng(34);
  const std::vector<double> dy = random_vec(rng, c.tokens * c.out);
  std::vector<double> dx(c.x.size(), 0.0), da(c.a.size(), 0.0), db(c.b.size(), 0.0);
  lora_backward(dx.data(), da.data(), db.data(), dy.data(), c.x.data(), c.w.data(), c.a.data(),
                c.b.data(), nullptr, c.scaling, c.tokens, c.in, c.out, c.rank);
  const std::vector<double> dx1 = dx, da1 = da, db1 = db;
  lora_backward(dx.data(), da.data(), db.data(), dy.data(), c.x.data(), c.w.data(), c.a.data(),
                c.b.data(), nullptr, c.scaling, c.tokens, c.in, c.out, c.rank);
  EXPECT_EQ(dx, dx1);
  for (size_t i = 0; i < da.size(); ++i) EXPECT_DOUBLE_EQ(da[i], 2 * da1[i]);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_DOUBLE_EQ(db[i], 2 * db1[i]);
  // dx may be skipped.
  lora_backward(nullptr, da.data(), db.data(), dy.data(), c.x.data(), c.w.data(), c.a.data(),
                c.b.data(), nullptr, c.scaling, c.tokens, c.in, c.out, c.rank);
  for (size_t i = 0; i < da.size(); ++i) EXPECT_DOUBLE_EQ(da[i], 3 * da1[i]);
}

TEST(RefLora, ZeroBIsANoOpAndGetsGradient) {
  // PEFT init: B = 0 -> y equals the base layer, dA = 0, but dB != 0 (so training can start).
  LoraCase c(35, false);
  std::fill(c.b.begin(), c.b.end(), 0.0);
  std::vector<double> y(c.tokens * c.out), base(c.tokens * c.out);
  const std::vector<double> zero_a(c.a.size(), 0.0);
  lora_forward(y.data(), nullptr, c.x.data(), c.w.data(), c.bias.data(), c.a.data(), c.b.data(),
               nullptr, c.scaling, c.tokens, c.in, c.out, c.rank);
  lora_forward(base.data(), nullptr, c.x.data(), c.w.data(), c.bias.data(), zero_a.data(),
               c.b.data(), nullptr, 0.0, c.tokens, c.in, c.out, c.rank);
  EXPECT_EQ(y, base);
  std::mt19937_64 rng(36);
  const std::vector<double> dy = random_vec(rng, c.tokens * c.out);
  std::vector<double> da(c.a.size(), 0.0), db(c.b.size(), 0.0);
  lora_backward(nullptr, da.data(), db.data(), dy.data(), c.x.data(), c.w.data(), c.a.data(),
                c.b.data(), nullptr, c.scaling, c.tokens, c.in, c.out, c.rank);
  for (double g : da) EXPECT_EQ(g, 0.0);
  double norm_b = 0.0;
  for (double g : db) norm_b += g * g;
  EXPECT_GT(norm_b, 1e-6);
}

TEST(RefLora, MergedWeightGivesTheSameOutput) {
  const LoraCase c(37, false);
  std::vector<double> merged(c.w.size()), y(c.tokens * c.out), y_merged(c.tokens * c.out);
  lora_merge(merged.data(), c.w.data(), c.a.data(), c.b.data(), c.scaling, c.in, c.out, c.rank);
  lora_forward(y.data(), nullptr, c.x.data(), c.w.data(), c.bias.data(), c.a.data(), c.b.data(),
               nullptr, c.scaling, c.tokens, c.in, c.out, c.rank);
  const std::vector<double> zero_b(c.b.size(), 0.0);
  lora_forward(y_merged.data(), nullptr, c.x.data(), merged.data(), c.bias.data(), c.a.data(),
               zero_b.data(), nullptr, c.scaling, c.tokens, c.in, c.out, c.rank);
  EXPECT_LT(test::max_rel_diff(y_merged, y), 1e-14);
}

TEST(RefLora, RankZeroIsThePlainLinear) {
  // rank 0: y = x W^T + b and dx = dy W (a frozen linear without adapter, e.g. Qwen2's biased q).
  std::mt19937_64 rng(38);
  const int64_t tokens = 7, in = 13, out = 5;
  std::vector<double> x = random_vec(rng, tokens * in);
  const std::vector<double> w = random_vec(rng, out * in), bias = random_vec(rng, out);
  const std::vector<double> dy = random_vec(rng, tokens * out);
  std::vector<double> y(tokens * out), dx(tokens * in);
  lora_forward(y.data(), nullptr, x.data(), w.data(), bias.data(), nullptr, nullptr, nullptr, 2.0,
               tokens, in, out, 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double want = bias[o];
      for (int64_t i = 0; i < in; ++i) want += x[t * in + i] * w[o * in + i];
      EXPECT_NEAR(y[t * out + o], want, 1e-13);
    }
  }
  lora_backward(dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), nullptr, nullptr,
                nullptr, 2.0, tokens, in, out, 0);
  EXPECT_FD_OK(fd_check(x, dx, [&] {
    lora_forward(y.data(), nullptr, x.data(), w.data(), bias.data(), nullptr, nullptr, nullptr,
                 2.0, tokens, in, out, 0);
    return test::dot(dy, y);
  }));
}

}  // namespace
}  // namespace forja::ref
