// Tests of the fused LM-head cross-entropy reference: plain vs chunked, finite differences of
// d(sum/N)/dx, a hand example, label shifting and validation.
#include "ops/ref/cross_entropy_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "ops_ref/fd_check.h"

namespace forja::ref {
namespace {

using test::fd_check;
using test::random_vec;

struct CeCase {
  int64_t tokens = 7, hidden = 13, vocab = 37;
  std::vector<double> x, w;
  std::vector<int32_t> labels;
  explicit CeCase(uint64_t seed, double logit_scale = 1.0) {
    std::mt19937_64 rng(seed);
    x = random_vec(rng, tokens * hidden, -logit_scale, logit_scale);
    w = random_vec(rng, vocab * hidden);
    labels = {3, kIgnoreIndex, 36, 0, 17, kIgnoreIndex, 17};
  }
};

TEST(RefCrossEntropy, HandExample) {
  // hidden 1, x = 1, so logits are W's column: [1, 2, 3]; label 2 at t=0, ignored at t=1.
  const std::vector<double> x = {1.0, 5.0}, w = {1.0, 2.0, 3.0};
  const std::vector<int32_t> labels = {2, kIgnoreIndex};
  int64_t count = -1;
  std::vector<double> losses(2), lse(2);
  const double sum = cross_entropy_forward(&count, losses.data(), lse.data(), x.data(), w.data(),
                                           labels.data(), 2, 1, 3);
  const double want = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  EXPECT_EQ(count, 1);
  EXPECT_NEAR(sum, want, 1e-15);
  EXPECT_NEAR(losses[0], want, 1e-15);
  EXPECT_EQ(losses[1], 0.0);
  EXPECT_NEAR(lse[1], std::log(std::exp(5.0) + std::exp(10.0) + std::exp(15.0)), 1e-13);
  // dx[0] = (sum_v p_v w_v - w_label) / N with N = 4.
  std::vector<double> dx(2);
  cross_entropy_backward(dx.data(), x.data(), w.data(), labels.data(), 4, 2, 1, 3);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const double ew = (std::exp(1.0) * 1 + std::exp(2.0) * 2 + std::exp(3.0) * 3) / z;
  EXPECT_NEAR(dx[0], (ew - 3.0) / 4.0, 1e-15);
  EXPECT_EQ(dx[1], 0.0);
}

TEST(RefCrossEntropy, BackwardMatchesFiniteDifferencesOfSumOverN) {
  CeCase c(40);
  const int64_t n_items = 9;  // the step's token count, larger than this micro-batch's 5
  std::vector<double> dx(c.x.size());
  cross_entropy_backward(dx.data(), c.x.data(), c.w.data(), c.labels.data(), n_items, c.tokens,
                         c.hidden, c.vocab);
  auto loss = [&] {
    return cross_entropy_forward(nullptr, nullptr, nullptr, c.x.data(), c.w.data(), c.labels.data(),
                                 c.tokens, c.hidden, c.vocab) /
           static_cast<double>(n_items);
  };
  EXPECT_FD_OK(fd_check(c.x, dx, loss));
  // Ignored rows get exactly zero gradient.
  for (int64_t h = 0; h < c.hidden; ++h) {
    EXPECT_EQ(dx[1 * c.hidden + h], 0.0);
    EXPECT_EQ(dx[5 * c.hidden + h], 0.0);
  }
}

TEST(RefCrossEntropy, ChunkedEqualsPlain) {
  for (double logit_scale : {1.0, 60.0}) {  // 60: logits in the hundreds, exp would overflow
    const CeCase c(41, logit_scale);
    int64_t count = 0;
    std::vector<double> losses(c.tokens), lse(c.tokens), dx(c.x.size());
    const double sum =
        cross_entropy_forward(&count, losses.data(), lse.data(), c.x.data(), c.w.data(),
                              c.labels.data(), c.tokens, c.hidden, c.vocab);
    ASSERT_TRUE(std::isfinite(sum));
    EXPECT_EQ(count, 5);
    cross_entropy_backward(dx.data(), c.x.data(), c.w.data(), c.labels.data(), 11, c.tokens,
                           c.hidden, c.vocab);
    for (int64_t chunk : {1, 5, 8, 36, 37, 100}) {
      int64_t count_c = 0;
      std::vector<double> losses_c(c.tokens), lse_c(c.tokens), dx_c(c.x.size());
      const double sum_c = cross_entropy_forward_chunked(&count_c, losses_c.data(), lse_c.data(),
                                                         c.x.data(), c.w.data(), c.labels.data(),
                                                         c.tokens, c.hidden, c.vocab, chunk);
      cross_entropy_backward_chunked(dx_c.data(), c.x.data(), c.w.data(), c.labels.data(), 11,
                                     c.tokens, c.hidden, c.vocab, chunk);
      EXPECT_EQ(count_c, count);
      EXPECT_NEAR(sum_c, sum, 1e-12 * std::fabs(sum)) << "chunk " << chunk;
      EXPECT_LT(test::max_rel_diff(losses_c, losses), 1e-12) << "chunk " << chunk;
      EXPECT_LT(test::max_rel_diff(lse_c, lse), 1e-13) << "chunk " << chunk;
      EXPECT_LT(test::max_rel_diff(dx_c, dx), 1e-12) << "chunk " << chunk;
    }
  }
}

TEST(RefCrossEntropy, ChunkedBackwardMatchesFiniteDifferences) {
  CeCase c(42);
  std::vector<double> dx(c.x.size());
  cross_entropy_backward_chunked(dx.data(), c.x.data(), c.w.data(), c.labels.data(), 5, c.tokens,
                                 c.hidden, c.vocab, 8);
  EXPECT_FD_OK(fd_check(c.x, dx, [&] {
    return cross_entropy_forward_chunked(nullptr, nullptr, nullptr, c.x.data(), c.w.data(),
                                         c.labels.data(), c.tokens, c.hidden, c.vocab, 8) /
           5.0;
  }));
}

TEST(RefCrossEntropy, AllIgnored) {
  const CeCase c(43);
  const std::vector<int32_t> labels(c.tokens, kIgnoreIndex);
  int64_t count = -1;
  EXPECT_EQ(cross_entropy_forward(&count, nullptr, nullptr, c.x.data(), c.w.data(), labels.data(),
                                  c.tokens, c.hidden, c.vocab),
            0.0);
  EXPECT_EQ(count, 0);
  std::vector<double> dx(c.x.size(), 7.0);
  cross_entropy_backward_chunked(dx.data(), c.x.data(), c.w.data(), labels.data(), 0, c.tokens,
                                 c.hidden, c.vocab, 8);
  for (double g : dx) EXPECT_EQ(g, 0.0);
}

TEST(RefCrossEntropy, RejectsBadLabels) {
  const CeCase c(44);
  for (int32_t bad : {37, -1, -101}) {
    std::vector<int32_t> labels = c.labels;
    labels[2] = bad;
    EXPECT_THROW(cross_entropy_forward(nullptr, nullptr, nullptr, c.x.data(), c.w.data(),
                                       labels.data(), c.tokens, c.hidden, c.vocab),
                 std::out_of_range)
        << bad;
    std::vector<double> dx(c.x.size());
    EXPECT_THROW(cross_entropy_backward_chunked(dx.data(), c.x.data(), c.w.data(), labels.data(), 5,
                                                c.tokens, c.hidden, c.vocab, 8),
                 std::out_of_range)
        << bad;
  }
}

TEST(RefCrossEntropy, ShiftLabels) {
  const std::vector<int32_t> labels = {-100, -100, 5,    6,  //
                                       7,    8,    -100, 9};
  std::vector<int32_t> shifted(8);
  shift_labels(shifted.data(), labels.data(), 2, 4);
  EXPECT_EQ(shifted, (std::vector<int32_t>{-100, 5, 6, -100, 8, -100, 9, -100}));
}

}  // namespace
}  // namespace forja::ref
