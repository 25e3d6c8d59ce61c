// GEMM against the double-precision reference (ops/ref/gemm_ref.h): every kernel variant, all
// four transpose combinations, fp32 and fp16 operands, sizes that are not tile multiples, with
// sentinels around and between the rows of C to catch out-of-bounds writes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "io/float16.h"
#include "ops/gemm.h"
#include "ops/ref/gemm_ref.h"
#include "support/gpu_fixture.h"

namespace forja::test {
namespace {

using ops::DType;
using ops::GemmKernel;

constexpr float kSentinel = -12345.0f;

struct Case {
  uint32_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

std::string case_name(const Case& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + (c.ta ? " At" : " A") +
         (c.tb ? " Bt" : " B") + " alpha " + std::to_string(c.alpha) + " beta " + std::to_string(c.beta);
}

class GemmTest : public GpuTest {
 protected:
  // Runs one product and checks it. `exact_values`: inputs from {-0.5, 0, 0.5, 1}, so every
  // product and partial sum is exact in fp32 and the result must equal the reference exactly.
  // a_f32 (with dtype f16): mixed operands, A uploaded in fp32 (unrounded), which the kernel
  // rounds to fp16 on load; the reference multiplies the rounded values.
  void run(const Case& c, DType dtype, GemmKernel kernel, bool exact_values, uint32_t seed = 1, bool a_f32 = false) {
    SCOPED_TRACE(case_name(c) + " " + ops::gemm_kernel_name(kernel) + (dtype == DType::f16 ? " f16" : " f32") +
                 (a_f32 ? " A f32" : ""));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 3);
    const float exact[4] = {-0.5f, 0.0f, 0.5f, 1.0f};
    auto round16 = [](float v) { return io::f16_to_float(io::float_to_f16(v)); };
    auto draw = [&] {
      float v = exact_values ? exact[pick(rng)] : uni(rng);
      if (dtype == DType::f16) v = round16(v);  // the value the GPU sees
      return v;
    };
    // Stored shapes with padded leading dimensions (ld > row length) to test strides.
    const uint32_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
    const uint32_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
    const uint32_t lda = a_cols + (dtype == DType::f16 ? 8 : 3), ldb = b_cols + 5, ldc = c.n + 2;
    const uint32_t c_pad = 7;  // sentinel rows before and after C
    std::vector<float> a(size_t(a_rows) * lda), b(size_t(b_rows) * ldb);
    for (auto& v : a) v = a_f32 ? (exact_values ? exact[pick(rng)] : uni(rng)) : draw();
    for (auto& v : b) v = draw();
    std::vector<float> cmat(size_t(c.m + 2 * c_pad) * ldc, kSentinel);
    for (uint32_t i = 0; i < c.m; ++i)
      for (uint32_t j = 0; j < c.n; ++j) cmat[(c_pad + i) * ldc + j] = c.beta != 0 ? draw() : std::nanf("");

    std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end());
    if (a_f32)
      for (double& v : ad) v = round16(static_cast<float>(v));
    std::vector<double> cd(size_t(c.m) * ldc, 0.0);
    for (uint32_t i = 0; i < c.m; ++i)
      for (uint32_t j = 0; j < c.n; ++j) cd[i * ldc + j] = cmat[(c_pad + i) * ldc + j];
    ref::gemm_ld(cd.data(), ldc, ad.data(), lda, bd.data(), ldb, c.m, c.n, c.k, c.ta, c.tb, c.alpha, c.beta);

    auto upload_operand = [&](const std::vector<float>& v, DType dt) {
      gpu::Buffer buf = ctx().alloc(v.size() * ops::dtype_bytes(dt) + 64);
      if (dt == DType::f32) {
        ctx().upload(buf, v);
      } else {
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); ++i) h[i] = io::float_to_f16(v[i]);
        ctx().upload(buf, h);
      }
      return buf;
    };
    const DType a_dtype = a_f32 ? DType::f32 : dtype;
    gpu::Buffer ga = upload_operand(a, a_dtype), gb = upload_operand(b, dtype);
    gpu::Buffer gc = ctx().alloc(cmat.size() * 4);
    ctx().upload(gc, cmat);

    ops::GemmShape shape{c.m, c.n, c.k, c.ta, c.tb, c.alpha, c.beta};
    ops::gemm(ctx(), shape, {ga, a_dtype, 0, lda}, {gb, dtype, 0, ldb}, {gc, DType::f32, uint64_t(c_pad) * ldc, ldc},
              kernel);
    auto out = ctx().download<float>(gc, cmat.size());
    ctx().free(ga);
    ctx().free(gb);
    ctx().free(gc);

    size_t bad = 0;
    for (uint32_t r = 0; r < c.m + 2 * c_pad; ++r) {
      for (uint32_t j = 0; j < ldc; ++j) {
        const float got = out[size_t(r) * ldc + j];
        const bool inside = r >= c_pad && r < c_pad + c.m && j < c.n;
        if (!inside) {
          if (got != kSentinel && bad++ < 5) ADD_FAILURE() << "write outside C at row " << r << " col " << j;
          continue;
        }
        const uint32_t i = r - c_pad;
        const double want = cd[size_t(i) * ldc + j];
        // fp32 accumulation of k terms of magnitude <= 1: error grows like k * eps32.
        const double tol = exact_values ? 0.0 : 1e-6 * (c.k + 4) * (std::abs(c.alpha) + std::abs(c.beta) + 1);
        if (!(std::abs(got - want) <= tol) && bad++ < 5)
          ADD_FAILURE() << "C[" << i << "," << j << "] = " << got << ", want " << want;
      }
    }
    EXPECT_EQ(bad, 0u);
  }

  std::vector<Case> awkward_cases() {
    std::vector<Case> cases;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        cases.push_back({1, 1, 1, ta, tb, 1.0f, 0.0f});
        cases.push_back({17, 33, 65, ta, tb, 1.0f, 0.0f});
        cases.push_back({17, 33, 65, ta, tb, -0.5f, 1.0f});
        cases.push_back({70, 3, 129, ta, tb, 2.0f, 0.5f});
      }
    return cases;
  }
};

TEST_F(GemmTest, ScalarF32AllTransposes) {
  for (const Case& c : awkward_cases()) run(c, DType::f32, GemmKernel::scalar, false);
  run({1000, 3, 777, false, true, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar, false);
  run({5, 4100, 37, false, true, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar, false);
  run({130, 129, 4099, true, false, 1.0f, 1.0f}, DType::f32, GemmKernel::scalar, false);
}

TEST_F(GemmTest, ScalarF16AllTransposes) {
  for (const Case& c : awkward_cases()) run(c, DType::f16, GemmKernel::scalar, false);
  run({1000, 3, 777, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::scalar, false);
}

// Mixed operands (A fp32 rounded to fp16 on load, B fp16) on the scalar kernel: what mixed
// precision runs on devices without cooperative matrices.
TEST_F(GemmTest, ScalarMixedOperandsAllTransposes) {
  for (const Case& c : awkward_cases()) run(c, DType::f16, GemmKernel::scalar, false, 1, true);
  run({1000, 3, 777, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::scalar, false, 1, true);
  run({130, 129, 300, false, false, 1.0f, 0.5f}, DType::f16, GemmKernel::scalar, false, 2, true);  // 128 tile
  run({64, 64, 64, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::scalar, true, 1, true);
}

TEST_F(GemmTest, RejectsFp16AWithFp32B) {
  gpu::Buffer buf = ctx().alloc(1024);
  EXPECT_THROW(ops::gemm(ctx(), {4, 4, 4, false, true}, {buf, DType::f16, 0, 4}, {buf, DType::f32, 0, 4},
                         {buf, DType::f32, 0, 4}),
               std::logic_error);
  EXPECT_THROW(ops::gemm(ctx(), {4, 4, 4, false, true}, {buf, DType::f32, 0, 4}, {buf, DType::f32, 0, 4},
                         {buf, DType::f32, 0, 4}, GemmKernel::coopmat_emulated),
               std::logic_error);
  ctx().free(buf);
}

TEST_F(GemmTest, ZeroKScalesC) {
  run({9, 11, 0, false, true, 1.0f, 0.5f}, DType::f32, GemmKernel::scalar, true);
}

TEST_F(GemmTest, ScalarExactValuesBitExact) {
  run({64, 64, 64, false, true, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar, true);
}

// The cooperative-matrix kernel's tiling and addressing, with the matrix operations emulated by
// scalar code (runs on any device): bit-exact on exactly representable inputs.
TEST_F(GemmTest, CoopmatEmulatedBitExact) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run({1, 1, 1, ta, tb, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, true);
      run({17, 33, 65, ta, tb, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, true);
      run({64, 72, 96, ta, tb, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, true);  // vector loads
      run({70, 3, 40, ta, tb, 0.5f, 1.0f}, DType::f16, GemmKernel::coopmat_emulated, true);
    }
}

// The same with an fp32 A rounded to fp16 while staged (the _af32 variant); random values
// check the rounding against the CPU's round-to-nearest-even.
TEST_F(GemmTest, CoopmatEmulatedMixedOperands) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run({17, 33, 65, ta, tb, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, true, 1, true);
      run({70, 3, 40, ta, tb, 0.5f, 1.0f}, DType::f16, GemmKernel::coopmat_emulated, false, 1, true);
    }
  // vector loads of A (as training uses it: A [M, K] not transposed)
  run({64, 72, 96, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, false, 3, true);
  run({64, 72, 96, false, false, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, false, 3, true);
  run({64, 72, 96, true, true, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, true, 1, true);
}

// The real cooperative-matrix kernel, where the device has one (not lavapipe).
TEST_F(GemmTest, CoopmatBitExactAndRandom) {
  if (ops::gemm_kernel_for(ctx(), DType::f16) != GemmKernel::coopmat)
    GTEST_SKIP() << "no NV cooperative matrix 16x16x16 f16->f32 on " << ctx().info().name;
  for (const Case& c : awkward_cases()) run(c, DType::f16, GemmKernel::coopmat, true);
  for (const Case& c : awkward_cases()) run(c, DType::f16, GemmKernel::coopmat, false);
  run({1000, 3, 777, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat, true);
  run({256, 4096, 128, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat, true);
  run({512, 512, 4100, true, false, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat, true);
  run({2048, 1024, 256, false, false, 1.0f, 1.0f}, DType::f16, GemmKernel::coopmat, false);
  // mixed operands (fp32 A)
  for (const Case& c : awkward_cases()) run(c, DType::f16, GemmKernel::coopmat, false, 1, true);
  run({256, 4096, 128, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat, false, 1, true);
  run({2048, 1024, 256, false, false, 1.0f, 1.0f}, DType::f16, GemmKernel::coopmat, false, 1, true);
}

// Operands larger than maxStorageBufferRange are split into several dispatches. Only on
// devices where the range is small enough to test cheaply (lavapipe: 128 MiB).
TEST_F(GemmTest, SplitsOperandsLargerThanTheBindingLimit) {
  const uint64_t range = ctx().info().max_storage_buffer_range;
  if (range > (256ull << 20)) GTEST_SKIP() << "binding limit " << range << " too large to exceed cheaply";
  const uint32_t k = 64;
  const uint32_t n = static_cast<uint32_t>(range / (k * 4) + 1000);  // B (fp32 [n, k]) exceeds the range
  run({3, n, k, false, true, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar, true);
}

}  // namespace
}  // namespace forja::test
