// Tests of the elementwise, SwiGLU, embedding and GEMM references, and of the FD harness itself.
#include "ops/ref/elementwise_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "ops/ref/embedding_ref.h"
#include "ops/ref/gemm_ref.h"
#include "ops/ref/swiglu_ref.h"
#include "ops_ref/fd_check.h"

namespace forja::ref {
namespace {

using test::fd_check;
using test::random_vec;

TEST(RefFiniteDiff, DetectsAWrongGradient) {
  // L(x) = sum x^3: gradient 3x^2. A gradient off by 1e-4 in one element must fail the bound.
  std::mt19937_64 rng(1);
  std::vector<double> x = random_vec(rng, 13);
  std::vector<double> g(13);
  for (size_t i = 0; i < x.size(); ++i) g[i] = 3 * x[i] * x[i];
  auto loss = [&] {
    double s = 0;
    for (double v : x) s += v * v * v;
    return s;
  };
  EXPECT_LT(fd_check(x, g, loss).rel_error, test::kFdTol);
  g[5] += 1e-4;
  EXPECT_GT(fd_check(x, g, loss).rel_error, test::kFdTol);
}

TEST(RefElementwise, AddScale) {
  const std::vector<double> a = {1, -2, 3.5}, b = {0.5, 2, -1};
  std::vector<double> y(3);
  add(y.data(), a.data(), b.data(), 3);
  EXPECT_EQ(y, (std::vector<double>{1.5, 0, 2.5}));
  scale(y.data(), y.data(), -2.0, 3);  // in place
  EXPECT_EQ(y, (std::vector<double>{-3, 0, -5}));
}

TEST(RefElementwise, SiluValues) {
  EXPECT_EQ(silu(0.0), 0.0);
  EXPECT_NEAR(silu(1.0), 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(silu(-3.0), -3.0 / (1.0 + std::exp(3.0)), 1e-15);
  EXPECT_EQ(silu(-1000.0), -0.0);  // no overflow, no NaN
  EXPECT_EQ(silu(1000.0), 1000.0);
  EXPECT_NEAR(silu_grad(0.0), 0.5, 1e-15);
}

TEST(RefElementwise, SiluBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(2);
  const int64_t n = 91;
  std::vector<double> x = random_vec(rng, n, -6, 6), dy = random_vec(rng, n), dx(n), y(n);
  silu_backward(dx.data(), dy.data(), x.data(), n);
  EXPECT_FD_OK(fd_check(x, dx, [&] {
    silu_forward(y.data(), x.data(), n);
    return test::dot(dy, y);
  }));
}

TEST(RefSwiglu, ForwardValues) {
  const std::vector<double> g = {0.0, 2.0, -1.5}, u = {3.0, -0.5, 4.0};
  std::vector<double> h(3);
  swiglu_forward(h.data(), g.data(), u.data(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(h[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-15);
}

TEST(RefSwiglu, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(3);
  const int64_t rows = 7, cols = 13, n = rows * cols;
  std::vector<double> g = random_vec(rng, n, -4, 4), u = random_vec(rng, n, -2, 2);
  const std::vector<double> dh = random_vec(rng, n);
  std::vector<double> dg(n), du(n), h(n);
  swiglu_backward(dg.data(), du.data(), dh.data(), g.data(), u.data(), n);
  auto loss = [&] {
    swiglu_forward(h.data(), g.data(), u.data(), n);
    return test::dot(dh, h);
  };
  EXPECT_FD_OK(fd_check(g, dg, loss));
  EXPECT_FD_OK(fd_check(u, du, loss));
}

TEST(RefElementwise, RowReductions) {
  const int64_t rows = 3, cols = 4;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> x = {1,  -2,  3,  0.5,  //
                                 -1, -7,  -3, -2,   //
                                 4,  nan, 1,  9};
  std::vector<double> out(rows);
  row_sum(out.data(), x.data(), 2, cols);
  EXPECT_EQ(out[0], 2.5);
  EXPECT_EQ(out[1], -13.0);
  row_sum_squares(out.data(), x.data(), 2, cols);
  EXPECT_EQ(out[0], 14.25);
  EXPECT_EQ(out[1], 63.0);
  row_max(out.data(), x.data(), rows, cols);
  EXPECT_EQ(out[0], 3.0);
  EXPECT_EQ(out[1], -1.0);
  EXPECT_TRUE(std::isnan(out[2])) << "row_max must propagate NaN";
  row_max(out.data(), x.data(), 1, 0);
  EXPECT_EQ(out[0], -std::numeric_limits<double>::infinity());
}

TEST(RefElementwise, GlobalL2Norm) {
  const std::vector<double> a = {3.0}, b = {0.0, 4.0}, c = {12.0};
  const double* bufs[] = {a.data(), b.data(), c.data()};
  const int64_t sizes[] = {1, 2, 1};
  EXPECT_DOUBLE_EQ(global_l2_norm(bufs, sizes, 2), 5.0);
  EXPECT_DOUBLE_EQ(global_l2_norm(bufs, sizes, 3), 13.0);
  EXPECT_EQ(global_l2_norm(bufs, sizes, 0), 0.0);
}

TEST(RefEmbedding, GatherAndValidate) {
  const int64_t vocab = 5, hidden = 3;
  std::vector<double> table(vocab * hidden);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<double>(i);
  const std::vector<int32_t> ids = {4, 0, 4, 2};
  std::vector<double> y(ids.size() * hidden);
  embedding_forward(y.data(), ids.data(), table.data(), 4, vocab, hidden);
  EXPECT_EQ(y, (std::vector<double>{12, 13, 14, 0, 1, 2, 12, 13, 14, 6, 7, 8}));
  const std::vector<int32_t> bad_hi = {1, 5}, bad_lo = {-1};
  EXPECT_THROW(embedding_forward(y.data(), bad_hi.data(), table.data(), 2, vocab, hidden),
               std::out_of_range);
  EXPECT_THROW(embedding_forward(y.data(), bad_lo.data(), table.data(), 1, vocab, hidden),
               std::out_of_range);
}

TEST(RefEmbedding, BackwardAccumulatesAndMatchesFiniteDifferences) {
  std::mt19937_64 rng(4);
  const int64_t vocab = 37, hidden = 13, tokens = 11;
  std::vector<double> table = random_vec(rng, vocab * hidden);
  std::vector<int32_t> ids(tokens);
  for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * 7) % 5);  // repeats
  const std::vector<double> dy = random_vec(rng, tokens * hidden);
  std::vector<double> dtable(vocab * hidden, 0.0), y(tokens * hidden);
  embedding_backward(dtable.data(), dy.data(), ids.data(), tokens, vocab, hidden);
  EXPECT_FD_OK(fd_check(table, dtable, [&] {
    embedding_forward(y.data(), ids.data(), table.data(), tokens, vocab, hidden);
    return test::dot(dy, y);
  }));
  // Parameter gradient: a second call adds the same amount again.
  std::vector<double> twice = dtable;
  embedding_backward(twice.data(), dy.data(), ids.data(), tokens, vocab, hidden);
  for (size_t i = 0; i < twice.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * dtable[i]);
}

// Naive product with explicit index maps, independent of gemm_ld's loop.
double op_at(const std::vector<double>& a, bool trans, int64_t ld, int64_t row, int64_t col) {
  return trans ? a[col * ld + row] : a[row * ld + col];
}

TEST(RefGemm, AllTransposeCombosWithLeadingDimensions) {
  std::mt19937_64 rng(5);
  const int64_t m = 7, n = 5, k = 13;
  const double alpha = 0.75, beta = -1.25, sentinel = 12345.0;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 4;
      const std::vector<double> a = random_vec(rng, (ta ? k : m) * lda);
      const std::vector<double> b = random_vec(rng, (tb ? n : k) * ldb);
      std::vector<double> c = random_vec(rng, m * ldc);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = n; j < ldc; ++j) c[i * ldc + j] = sentinel;
      }
      const std::vector<double> c0 = c;
      gemm_ld(c.data(), ldc, a.data(), lda, b.data(), ldb, m, n, k, ta, tb, alpha, beta);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          if (j >= n) {
            EXPECT_EQ(c[i * ldc + j], sentinel) << "padding written at " << i << "," << j;
            continue;
          }
          double want = 0.0;
          for (int64_t p = 0; p < k; ++p) want += op_at(a, ta, lda, i, p) * op_at(b, tb, ldb, p, j);
          want = alpha * want + beta * c0[i * ldc + j];
          EXPECT_NEAR(c[i * ldc + j], want, 1e-13) << "ta=" << ta << " tb=" << tb;
        }
      }
    }
  }
}

TEST(RefGemm, BetaZeroIgnoresGarbageAndKZero) {
  const std::vector<double> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};  // 2x2 each
  std::vector<double> c(4, std::numeric_limits<double>::quiet_NaN());
  gemm(c.data(), a.data(), b.data(), 2, 2, 2, false, false);
  EXPECT_EQ(c, (std::vector<double>{19, 22, 43, 50}));
  gemm(c.data(), a.data(), b.data(), 2, 2, 2, true, true);  // A^T B^T = (B A)^T
  EXPECT_EQ(c, (std::vector<double>{23, 31, 34, 46}));
  gemm(c.data(), a.data(), b.data(), 2, 2, 0, false, false, 1.0, 2.0);  // k = 0: C = 2C
  EXPECT_EQ(c, (std::vector<double>{46, 62, 68, 92}));
}

}  // namespace
}  // namespace forja::ref
