// Helpers shared by the GPU op tests (tests/ops): seeded random inputs, uploads followed by
// sentinel padding, downloads that check the sentinels (catching writes past the end), a
// relative-error comparison against double-precision references, and buffers freed in TearDown.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "io/float16.h"
#include "support/gpu_fixture.h"

namespace forja::test {

inline constexpr float kSentinel = 777.25f;
inline constexpr uint32_t kPad = 16;  // sentinel elements after each output

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The fp16-output kernels' tests: a block of rows x cols values written into the first cols of
// each row of a [rows, ld] fp16 buffer, followed by 8 more halves (all sentinels beforehand).
struct F16Block {
  uint32_t rows, cols, ld;
  std::string name() const { return std::to_string(rows) + "x" + std::to_string(cols) + " ld " + std::to_string(ld); }
  size_t elements() const { return size_t(rows) * cols; }
  size_t halves() const { return size_t(rows) * ld + 8; }
};

// A GpuTest whose buffers are freed at TearDown. `seed` seeds rng_; random(n) draws from
// [lo, hi).
class GpuBufferTest : public GpuTest {
 protected:
  explicit GpuBufferTest(uint32_t seed, float lo = -1.0f, float hi = 1.0f) : rng_(seed), lo_(lo), hi_(hi) {}

  std::vector<float> random(size_t n) { return random(n, lo_, hi_); }
  std::vector<float> random(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng_);
    return v;
  }
  // Uploads v followed by kPad elements of `pad`.
  template <typename T>
  gpu::Buffer upload(const std::vector<T>& v, T pad) {
    gpu::Buffer b = ctx().alloc((v.size() + kPad) * sizeof(T));
    std::vector<T> padded(v);
    padded.resize(v.size() + kPad, pad);
    ctx().upload(b, padded);
    bufs_.push_back(b);
    return b;
  }
  gpu::Buffer upload(const std::vector<float>& v) { return upload(v, kSentinel); }
  // n NaNs followed by the sentinels.
  gpu::Buffer output(size_t n) { return upload(std::vector<float>(n, std::nanf(""))); }
  // Downloads n values and checks the sentinels after them.
  std::vector<float> result(const gpu::Buffer& b, size_t n) {
    auto v = ctx().download<float>(b, n + kPad);
    for (uint32_t i = 0; i < kPad; ++i) EXPECT_EQ(v[n + i], kSentinel) << "write past the end at +" << i;
    v.resize(n);
    return v;
  }
  // |got - want| <= rtol * (1 + |want|) element by element; reports the first five misses.
  static void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol) {
    ASSERT_EQ(got.size(), want.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::abs(got[i] - want[i]) <= rtol * (1.0 + std::abs(want[i]))) && bad++ < 5)
        ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
    EXPECT_EQ(bad, 0u);
  }
  // An fp16 output written into the first `cols` of each row of a [rows, ld] block that held
  // `sentinel` everywhere (got: the whole buffer read back): element (r, c) within an fp16 ulp of
  // want[r * cols + c] plus abs_tol, every other half still the sentinel; reports the first five
  // misses.
  static void expect_f16_block(const std::vector<uint16_t>& got, const F16Block& b, const std::vector<double>& want,
                               uint16_t sentinel, double abs_tol, const std::string& name = "") {
    const size_t rows = b.rows, cols = b.cols, ld = b.ld;
    ASSERT_EQ(want.size(), rows * cols);
    size_t bad = 0;
    for (size_t e = 0; e < got.size(); ++e) {
      const size_t r = e / ld, c = e % ld;
      if (r >= rows || c >= cols) {
        if (got[e] != sentinel && bad++ < 5) ADD_FAILURE() << name << " half " << e << " outside the block was written";
        continue;
      }
      const double w = want[r * cols + c], v = io::f16_to_float(got[e]);
      if (!(std::abs(v - w) <= std::abs(w) / 1024.0 + abs_tol) && bad++ < 5)
        ADD_FAILURE() << name << " (" << r << ", " << c << "): " << v << ", want " << w;
    }
    EXPECT_EQ(bad, 0u) << name;
  }
  void TearDown() override {
    for (auto& b : bufs_) ctx().free(b);
    GpuTest::TearDown();
  }

  std::mt19937 rng_;
  std::vector<gpu::Buffer> bufs_;

 private:
  float lo_, hi_;
};

}  // namespace forja::test
