// LM head + cross-entropy (ops/cross_entropy.h) against the chunked double-precision reference
// (ops/ref/cross_entropy_ref.h): vocabularies that are not a multiple of the chunk, ignored
// targets, fp16 W, loss accumulation across calls, several row blocks, and out-of-range targets.
// dx starts as NaN so rows the op forgets to write fail; sentinels follow every output.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "io/float16.h"
#include "ops/cross_entropy.h"
#include "ops/ref/cross_entropy_ref.h"
#include "support/gpu_fixture.h"

namespace forja::test {
namespace {

constexpr float kSentinel = 777.25f;
constexpr uint32_t kPad = 16;

struct Case {
  uint32_t tokens, hidden, vocab, chunk;
  bool f16 = false;
  std::string name() const {
    return "T" + std::to_string(tokens) + " H" + std::to_string(hidden) + " V" + std::to_string(vocab) + " chunk" +
           std::to_string(chunk) + (f16 ? " fp16" : " fp32");
  }
};

class CrossEntropyTest : public GpuTest {
 protected:
  std::vector<float> random(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng_);
    return v;
  }
  // Targets in [0, vocab) with about a third ignored (-100), including the first row when there
  // are several.
  std::vector<int32_t> random_targets(uint32_t tokens, uint32_t vocab) {
    std::uniform_int_distribution<int32_t> t(0, int32_t(vocab) - 1);
    std::vector<int32_t> v(tokens);
    for (uint32_t i = 0; i < tokens; ++i)
      v[i] = ((i == 0 && tokens > 2) || rng_() % 3 == 0) ? ref::kIgnoreIndex : t(rng_);
    if (tokens > 1) v[tokens - 1] = int32_t(vocab) - 1;  // the last vocabulary row (in the short chunk)
    return v;
  }
  gpu::Buffer upload_bytes(const void* data, size_t bytes, size_t pad_floats = kPad) {
    const size_t words = (bytes + 3) / 4;
    gpu::Buffer b = ctx().alloc((words + pad_floats) * 4);
    std::vector<float> padded(words + pad_floats, kSentinel);
    std::memcpy(padded.data(), data, bytes);
    ctx().upload(b, padded);
    bufs_.push_back(b);
    return b;
  }
  template <typename T>
  gpu::Buffer upload(const std::vector<T>& v) {
    return upload_bytes(v.data(), v.size() * sizeof(T));
  }
  std::vector<float> result(const gpu::Buffer& b, size_t n) {
    auto v = ctx().download<float>(b, n + kPad);
    for (uint32_t i = 0; i < kPad; ++i) EXPECT_EQ(v[n + i], kSentinel) << "write past the end at +" << i;
    v.resize(n);
    return v;
  }
  // |got - want| <= tol * max|want| elementwise (dx values span orders of magnitude).
  static void expect_close_to_scale(const std::vector<float>& got, const std::vector<double>& want, double tol) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    ASSERT_GT(scale, 0.0);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::abs(got[i] - want[i]) <= tol * scale) && bad++ < 5)
        ADD_FAILURE() << "dx element " << i << ": " << got[i] << " vs " << want[i] << " (scale " << scale << ")";
    EXPECT_EQ(bad, 0u);
  }
  void TearDown() override {
    for (auto& b : bufs_) ctx().free(b);
    GpuTest::TearDown();
  }

  // One call on the GPU and the reference; loss_sum starts at `loss0` to check it is added to.
  void check(const Case& c, double loss_tol, double dx_tol) {
    SCOPED_TRACE(c.name());
    auto x = random(size_t(c.tokens) * c.hidden, -2.0f, 2.0f);
    auto w = random(size_t(c.vocab) * c.hidden, -1.0f, 1.0f);
    auto targets = random_targets(c.tokens, c.vocab);
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
    gpu::Buffer gw;
    if (c.f16) {
      // The op multiplies fp16 copies of x and W; the reference sees the same rounded values.
      std::vector<uint16_t> wh(w.size());
      for (size_t i = 0; i < w.size(); ++i) wd[i] = io::f16_to_float(wh[i] = io::float_to_f16(w[i]));
      for (size_t i = 0; i < x.size(); ++i) xd[i] = io::f16_to_float(io::float_to_f16(x[i]));
      gw = upload(wh);
    } else {
      gw = upload(w);
    }
    int64_t count = 0;
    const double loss = ref::cross_entropy_forward_chunked(&count, nullptr, nullptr, xd.data(), wd.data(),
                                                           targets.data(), c.tokens, c.hidden, c.vocab, c.chunk);
    ASSERT_GT(count, 0);
    const int64_t n_items = count + 3;  // the optimizer step holds more targets than this call
    std::vector<double> dx(x.size());
    ref::cross_entropy_backward_chunked(dx.data(), xd.data(), wd.data(), targets.data(), n_items, c.tokens, c.hidden,
                                        c.vocab, c.chunk);

    const float loss0 = 1.5f;
    auto gx = upload(x), gt = upload(targets), gloss = upload(std::vector<float>{loss0});
    auto gdx = upload(std::vector<float>(x.size(), std::nanf("")));
    ops::lm_head_cross_entropy(ctx(), gx, gw, c.f16 ? ops::DType::f16 : ops::DType::f32, gt, c.tokens, c.hidden,
                               c.vocab, float(1.0 / double(n_items)), gloss, gdx, {c.chunk, true});
    const float got = result(gloss, 1)[0];
    EXPECT_NEAR(got - loss0, loss, loss_tol * std::abs(loss)) << "loss sum over " << count << " targets";
    expect_close_to_scale(result(gdx, x.size()), dx, dx_tol);
  }

  std::mt19937 rng_{11};
  std::vector<gpu::Buffer> bufs_;
};

TEST_F(CrossEntropyTest, Fp32MatchesChunkedReference) {
  check({37, 24, 1000, 128}, 1e-5, 1e-5);  // V % chunk = 104
  check({5, 7, 50, 7}, 1e-5, 1e-5);        // chunk of 7, last chunk of 1
  check({1, 33, 300, 8192}, 1e-5, 1e-5);   // chunk larger than V, one token
  check({70, 64, 2049, 512}, 1e-5, 1e-5);
}

TEST_F(CrossEntropyTest, Fp16WeightsMatchReference) {
  // Logits are exact products of the rounded operands (fp32 accumulation); dlogits are rounded to
  // fp16 for the dx product, a relative error of about 2^-11.
  check({37, 24, 1000, 128, true}, 1e-5, 2e-3);
  check({70, 64, 2049, 512, true}, 1e-5, 2e-3);
}

TEST_F(CrossEntropyTest, SeveralRowBlocks) {
  // The 32 MiB logits scratch holds 1024 rows of an 8192-wide chunk: 1030 tokens need two row
  // blocks (the second of 6 rows starts at an unaligned offset into x, targets and dx).
  check({1030, 8, 8200, 8192}, 1e-5, 1e-5);
}

TEST_F(CrossEntropyTest, LossAccumulatesAcrossCallsAndNoGradLeavesDx) {
  const uint32_t T = 19, H = 16, V = 333, chunk = 100;
  auto x = random(size_t(2) * T * H, -2.0f, 2.0f), w = random(size_t(V) * H, -1.0f, 1.0f);
  auto t1 = random_targets(T, V), t2 = random_targets(T, V);
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
  int64_t c1 = 0, c2 = 0;
  const double l1 =
      ref::cross_entropy_forward_chunked(&c1, nullptr, nullptr, xd.data(), wd.data(), t1.data(), T, H, V, chunk);
  const double l2 = ref::cross_entropy_forward_chunked(&c2, nullptr, nullptr, xd.data() + T * H, wd.data(), t2.data(),
                                                       T, H, V, chunk);
  std::vector<float> x2(x.begin() + T * H, x.end());
  x.resize(size_t(T) * H);
  auto gx1 = upload(x), gx2 = upload(x2), gw = upload(w), gt1 = upload(t1), gt2 = upload(t2);
  auto gloss = upload(std::vector<float>{0.0f});
  auto gdx = upload(std::vector<float>(size_t(T) * H, 42.0f));
  const ops::CrossEntropyOptions no_grad{chunk, false};
  ops::lm_head_cross_entropy(ctx(), gx1, gw, ops::DType::f32, gt1, T, H, V, 0.5f, gloss, gdx, no_grad);
  ops::lm_head_cross_entropy(ctx(), gx2, gw, ops::DType::f32, gt2, T, H, V, 0.5f, gloss, gdx, no_grad);
  EXPECT_NEAR(result(gloss, 1)[0], l1 + l2, 1e-5 * (l1 + l2));
  for (float v : result(gdx, size_t(T) * H)) ASSERT_EQ(v, 42.0f) << "need_grad = false must not touch dx";
}

TEST_F(CrossEntropyTest, AllIgnoredGivesZeroLossAndZeroDx) {
  const uint32_t T = 9, H = 5, V = 40;
  auto gx = upload(random(size_t(T) * H, -1, 1)), gw = upload(random(size_t(V) * H, -1, 1));
  auto gt = upload(std::vector<int32_t>(T, ref::kIgnoreIndex));
  auto gloss = upload(std::vector<float>{2.0f}), gdx = upload(std::vector<float>(size_t(T) * H, std::nanf("")));
  ops::lm_head_cross_entropy(ctx(), gx, gw, ops::DType::f32, gt, T, H, V, 0.25f, gloss, gdx, {16, true});
  EXPECT_EQ(result(gloss, 1)[0], 2.0f);
  for (float v : result(gdx, size_t(T) * H)) ASSERT_EQ(v, 0.0f);
}

TEST_F(CrossEntropyTest, OutOfRangeTargetMakesLossNaN) {
  const uint32_t T = 4, H = 8, V = 30;
  auto gx = upload(random(size_t(T) * H, -1, 1)), gw = upload(random(size_t(V) * H, -1, 1));
  auto gt = upload(std::vector<int32_t>{3, int32_t(V), ref::kIgnoreIndex, 0});
  auto gloss = upload(std::vector<float>{0.0f}), gdx = upload(std::vector<float>(size_t(T) * H));
  ops::lm_head_cross_entropy(ctx(), gx, gw, ops::DType::f32, gt, T, H, V, 0.5f, gloss, gdx, {8, false});
  EXPECT_TRUE(std::isnan(result(gloss, 1)[0]));
}

TEST_F(CrossEntropyTest, RejectsSmallBuffers) {
  auto b = upload(std::vector<float>(64));
  EXPECT_THROW(ops::lm_head_cross_entropy(ctx(), b, b, ops::DType::f32, b, 8, 8, 64, 1.0f, b, b),
               std::invalid_argument);
}

// Timing on a real GPU (not a test: run with --gtest_also_run_disabled_tests): Qwen3-8B's LM head
// (H 4096, V 151936) in fp16 over 4096 tokens, loss and dx.
TEST_F(CrossEntropyTest, DISABLED_BenchQwen3Shape) {
  const uint32_t T = 4096, H = 4096, V = 151936;
  auto gx = upload(random(size_t(T) * H, -1, 1));
  std::vector<uint16_t> wh(size_t(V) * H);
  std::mt19937 r(3);
  for (auto& h : wh) h = io::float_to_f16(float(int(r() % 2001) - 1000) * 1e-4f);
  auto gw = upload(wh), gt = upload(random_targets(T, V)), gloss = upload(std::vector<float>{0.0f});
  auto gdx = upload(std::vector<float>(size_t(T) * H));
  for (int pass = 0; pass < 3; ++pass) {
    auto t0 = std::chrono::steady_clock::now();
    ops::lm_head_cross_entropy(ctx(), gx, gw, ops::DType::f16, gt, T, H, V, 1.0f / T, gloss, gdx);
    ctx().finish();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "lm_head_cross_entropy T%u H%u V%u fp16: %.2f ms (%.1f TFLOP/s over 3 GEMMs)\n", T, H, V,
                 s * 1e3, 3 * 2.0 * T * H * double(V) / s * 1e-12);
  }
}

}  // namespace
}  // namespace forja::test
