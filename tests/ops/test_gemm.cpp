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

// How the operands are laid out in their buffers. The default pads every leading dimension
// to an odd length (A: 8 more for fp16), so no row starts 4-element aligned and the scalar
// kernel takes its element-by-element loads; aligned() makes every row, offset and batch
// stride a multiple of 4 (its vec4 chunk loads, when the contiguous extents allow).
struct Layout {
  uint32_t lda_pad = 3, ldb_pad = 5, ldc_pad = 2;  // leading dimension = stored row length + pad
  uint32_t a_offset = 0, b_offset = 0;             // elements before batch 0 of A, B
  uint32_t batch = 1;
  uint32_t stride_pad = 0;  // elements between the batches of A and B beyond the matrices
  // With dtype f16: mixed operands, A uploaded in fp32 (unrounded), which the kernel rounds to
  // fp16 on load; the reference multiplies the rounded values.
  bool a_f32 = false;
  uint32_t split_k = 0;  // GemmShape::split_k (0 = automatic)
  // m > 0: the emulated cooperative-matrix kernel at this fragment shape (ops::gemm_emulated).
  gpu::KhrFragment fragment{};
  static Layout aligned() { return {4, 4, 4, 0, 0, 1, 0, false}; }
};

class GemmTest : public GpuTest {
 protected:
  // Runs one product and checks it. `exact_values`: inputs from {-0.5, 0, 0.5, 1}, so every
  // product and partial sum is exact in fp32 and the result must equal the reference exactly.
  // a_f32: mixed operands (see Layout).
  void run(const Case& c, DType dtype, GemmKernel kernel, bool exact_values, uint32_t seed = 1, bool a_f32 = false) {
    Layout l;
    if (dtype == DType::f16) l.lda_pad = 8;
    l.a_f32 = a_f32;
    run(c, dtype, kernel, exact_values, l, seed);
  }
  void run(const Case& c, DType dtype, GemmKernel kernel, bool exact_values, const Layout& l, uint32_t seed = 1) {
    SCOPED_TRACE(case_name(c) + " " + ops::gemm_kernel_name(kernel) + (dtype == DType::f16 ? " f16" : " f32") +
                 (l.a_f32 ? " A f32" : "") + " pads " + std::to_string(l.lda_pad) + "," + std::to_string(l.ldb_pad) +
                 "," + std::to_string(l.ldc_pad) + " offsets " + std::to_string(l.a_offset) + "," +
                 std::to_string(l.b_offset) + " batch " + std::to_string(l.batch) + " stride pad " +
                 std::to_string(l.stride_pad) + " split_k " + std::to_string(l.split_k) + " fragment " +
                 std::to_string(l.fragment.m) + "x" + std::to_string(l.fragment.n) + "x" +
                 std::to_string(l.fragment.k) + "/" + std::to_string(l.fragment.subgroup_size));
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
    const uint32_t lda = a_cols + l.lda_pad, ldb = b_cols + l.ldb_pad, ldc = c.n + l.ldc_pad;
    const uint64_t a_stride = uint64_t(a_rows) * lda + l.stride_pad, b_stride = uint64_t(b_rows) * ldb + l.stride_pad;
    const uint32_t c_pad = 8;  // sentinel rows before, between and after the batches of C
    const uint64_t c_stride = uint64_t(c.m + c_pad) * ldc;
    std::vector<float> a(l.a_offset + l.batch * a_stride), b(l.b_offset + l.batch * b_stride);
    for (auto& v : a) v = l.a_f32 ? (exact_values ? exact[pick(rng)] : uni(rng)) : draw();
    for (auto& v : b) v = draw();
    std::vector<float> cmat(size_t(c_pad) * ldc + l.batch * c_stride, kSentinel);
    auto c_at = [&](uint32_t bi, uint32_t i, uint32_t j) -> float& {
      return cmat[size_t(c_pad) * ldc + bi * c_stride + size_t(i) * ldc + j];
    };
    for (uint32_t bi = 0; bi < l.batch; ++bi)
      for (uint32_t i = 0; i < c.m; ++i)
        for (uint32_t j = 0; j < c.n; ++j) c_at(bi, i, j) = c.beta != 0 ? draw() : std::nanf("");

    std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end());
    if (l.a_f32)
      for (double& v : ad) v = round16(static_cast<float>(v));
    std::vector<double> cd(size_t(l.batch) * c.m * ldc, 0.0);  // batch bi at bi * m * ldc
    for (uint32_t bi = 0; bi < l.batch; ++bi) {
      double* cb = cd.data() + size_t(bi) * c.m * ldc;
      for (uint32_t i = 0; i < c.m; ++i)
        for (uint32_t j = 0; j < c.n; ++j) cb[size_t(i) * ldc + j] = c_at(bi, i, j);
      ref::gemm_ld(cb, ldc, ad.data() + l.a_offset + bi * a_stride, lda, bd.data() + l.b_offset + bi * b_stride, ldb,
                   c.m, c.n, c.k, c.ta, c.tb, c.alpha, c.beta);
    }

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
    const DType a_dtype = l.a_f32 ? DType::f32 : dtype;
    gpu::Buffer ga = upload_operand(a, a_dtype), gb = upload_operand(b, dtype);
    gpu::Buffer gc = ctx().alloc(cmat.size() * 4);
    ctx().upload(gc, cmat);

    ops::GemmShape shape{c.m, c.n, c.k, c.ta, c.tb, c.alpha, c.beta, l.batch, a_stride, b_stride, c_stride};
    shape.split_k = l.split_k;
    if (l.fragment.m)
      ops::gemm_emulated(ctx(), shape, {ga, a_dtype, l.a_offset, lda}, {gb, dtype, l.b_offset, ldb},
                         {gc, DType::f32, uint64_t(c_pad) * ldc, ldc}, l.fragment);
    else
      ops::gemm(ctx(), shape, {ga, a_dtype, l.a_offset, lda}, {gb, dtype, l.b_offset, ldb},
                {gc, DType::f32, uint64_t(c_pad) * ldc, ldc}, kernel);
    auto out = ctx().download<float>(gc, cmat.size());
    ctx().free(ga);
    ctx().free(gb);
    ctx().free(gc);

    size_t bad = 0;
    const size_t rows = cmat.size() / ldc;
    for (size_t r = 0; r < rows; ++r) {
      const size_t rb = r < c_pad ? 0 : (r - c_pad) / (c.m + c_pad), ri = r < c_pad ? 0 : (r - c_pad) % (c.m + c_pad);
      for (uint32_t j = 0; j < ldc; ++j) {
        const float got = out[r * ldc + j];
        const bool inside = r >= c_pad && rb < l.batch && ri < c.m && j < c.n;
        if (!inside) {
          if (got != kSentinel && bad++ < 5) ADD_FAILURE() << "write outside C at row " << r << " col " << j;
          continue;
        }
        const double want = cd[(rb * c.m + ri) * ldc + j];
        // fp32 accumulation of k terms of magnitude <= 1: error grows like k * eps32.
        const double tol = exact_values ? 0.0 : 1e-6 * (c.k + 4) * (std::abs(c.alpha) + std::abs(c.beta) + 1);
        if (!(std::abs(got - want) <= tol) && bad++ < 5)
          ADD_FAILURE() << "C[" << rb << "][" << ri << "," << j << "] = " << got << ", want " << want;
      }
    }
    EXPECT_EQ(bad, 0u);
  }

  // A matrix-core family on the device: exact values bit-exact, random ones within the fp32
  // tolerance; every transpose; fp16 and mixed operands; tile multiples (NV2's unchecked
  // variant) and awkward sizes (its clamped one); misaligned views; batches.
  void family_suite(GemmKernel k) {
    for (const Case& c : awkward_cases()) run(c, DType::f16, k, true);
    for (const Case& c : awkward_cases()) run(c, DType::f16, k, false);
    for (const Case& c : awkward_cases()) run(c, DType::f16, k, false, 1, true);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        run({256, 512, 128, ta, tb, 1.0f, 0.0f}, DType::f16, k, true, Layout::aligned());
        run({256, 512, 128, ta, tb, 0.5f, 1.0f}, DType::f16, k, false, Layout::aligned());
        Layout mixed = Layout::aligned();
        mixed.a_f32 = true;
        run({384, 256, 192, ta, tb, 1.0f, 0.0f}, DType::f16, k, false, mixed);
        Layout batched = Layout::aligned();
        batched.batch = 3;
        run({128, 128, 64, ta, tb, 1.0f, 0.5f}, DType::f16, k, true, batched);
        // Split-K: a shorter last slice, beta, several output tiles each way, aligned rows and not.
        Layout split;
        split.lda_pad = 8;
        split.split_k = 5;
        run({70, 16, 1000, ta, tb, 1.0f, 0.0f}, DType::f16, k, true, split);
        run({130, 150, 2000, ta, tb, 0.5f, 1.0f}, DType::f16, k, false, split);
        split.a_f32 = true;
        run({70, 16, 1000, ta, tb, 1.0f, 0.0f}, DType::f16, k, false, split);
        Layout split_aligned = Layout::aligned();
        split_aligned.split_k = 7;
        run({2048, 16, 2048, ta, tb, 1.0f, 1.0f}, DType::f16, k, false, split_aligned);
      }
    run({1000, 3, 777, false, true, 1.0f, 0.0f}, DType::f16, k, true);
    run({512, 512, 4100, true, false, 1.0f, 0.0f}, DType::f16, k, true);
    run({2048, 1024, 256, false, false, 1.0f, 1.0f}, DType::f16, k, false);
    run({2048, 1024, 256, false, true, 1.0f, 1.0f}, DType::f16, k, false, 1, true);
    Layout offsets = Layout::aligned();
    offsets.a_offset = 3;
    offsets.b_offset = 5;
    run({200, 300, 100, false, true, 1.0f, 0.0f}, DType::f16, k, true, offsets);
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

// Both scalar tiles, whatever the automatic choice on this device, on the awkward sizes.
TEST_F(GemmTest, ScalarEachTileAllTransposes) {
  for (GemmKernel kernel : {GemmKernel::scalar_t64, GemmKernel::scalar_t128})
    for (DType dtype : {DType::f32, DType::f16})
      for (const Case& c : awkward_cases()) run(c, dtype, kernel, false);
}

// The vec4 chunk path (aligned rows and offsets, contiguous extents multiples of 4) next to
// the element path on the same shapes: misaligned offsets of A or B, odd leading dimensions,
// contiguous extents that are not multiples of 4. Sizes are not tile multiples (M, N) and K
// ends in a partial K step for both tiles.
TEST_F(GemmTest, ScalarVectorAndElementLoads) {
  for (GemmKernel kernel : {GemmKernel::scalar_t64, GemmKernel::scalar_t128})
    for (DType dtype : {DType::f32, DType::f16})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          run({132, 68, 36, ta, tb, 1.0f, 0.0f}, dtype, kernel, true, Layout::aligned());
          run({260, 196, 44, ta, tb, 0.5f, -1.0f}, dtype, kernel, false, Layout::aligned());
          run({4, 4, 4, ta, tb, 1.0f, 0.0f}, dtype, kernel, true, Layout::aligned());
          run({131, 67, 35, ta, tb, 1.0f, 0.5f}, dtype, kernel, true, Layout::aligned());
        }
  // One operand (or C) off the 4-element grid, the others on it.
  Layout misaligned_a = Layout::aligned(), misaligned_b = Layout::aligned(), odd_c = Layout::aligned();
  misaligned_a.a_offset = 2;
  misaligned_b.b_offset = 1;
  odd_c.ldc_pad = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run({132, 68, 36, ta, tb, 1.0f, 0.5f}, DType::f32, GemmKernel::scalar_t128, true, misaligned_a);
      run({132, 68, 36, ta, tb, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar_t128, true, misaligned_b);
      run({132, 68, 36, ta, tb, 1.0f, 0.5f}, DType::f32, GemmKernel::scalar_t128, true, odd_c);
    }
  run({132, 68, 36, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::scalar_t64, true, misaligned_a);
  run({132, 68, 36, true, false, 1.0f, 0.0f}, DType::f16, GemmKernel::scalar_t64, true, misaligned_b);
}

// Strided batches (gl_WorkGroupID.z): batch strides that keep the vec4 alignment and ones that
// break it, with sentinel rows between the batches of C.
TEST_F(GemmTest, ScalarBatches) {
  Layout aligned = Layout::aligned(), odd_stride = Layout::aligned();
  aligned.batch = odd_stride.batch = 3;
  odd_stride.stride_pad = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run({72, 136, 40, ta, tb, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar_t128, true, aligned);
      run({72, 136, 40, ta, tb, 1.0f, 0.5f}, DType::f32, GemmKernel::scalar_t64, false, odd_stride);
    }
  run({72, 136, 40, false, true, 2.0f, 0.0f}, DType::f16, GemmKernel::scalar_t64, true, aligned);
  run({72, 136, 40, true, false, 2.0f, 0.0f}, DType::f16, GemmKernel::scalar_t128, true, odd_stride);
  Layout legacy;
  legacy.batch = 2;
  run({17, 33, 65, false, true, 1.0f, 1.0f}, DType::f32, GemmKernel::scalar, false, legacy);
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
  run({8, 12, 0, false, true, 1.0f, 0.5f}, DType::f32, GemmKernel::scalar_t128, true, Layout::aligned());
}

TEST_F(GemmTest, ScalarExactValuesBitExact) {
  run({64, 64, 64, false, true, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar, true);
  run({256, 256, 64, false, true, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar_t128, true, Layout::aligned());
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
  if (!ops::gemm_kernel_available(ctx(), GemmKernel::coopmat))
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

// The KHR kernels take the fragment shape and subgroup size the device lists (AMD 16x16x16 at
// wave 32 or 64, Intel 8x16x16 at 16, others): the same tiling at each, emulated, bit-exact.
TEST_F(GemmTest, CoopmatEmulatedOtherFragments) {
  const gpu::KhrFragment fragments[] = {{16, 16, 16, 64}, {8, 16, 16, 16}, {16, 8, 16, 32}, {32, 32, 16, 32},
                                        {16, 16, 32, 8}, {32, 8, 8, 8}};
  for (const gpu::KhrFragment& f : fragments)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Layout l;
        l.lda_pad = 8;
        l.fragment = f;
        run({17, 33, 65, ta, tb, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, true, l);
        run({70, 3, 40, ta, tb, 0.5f, 1.0f}, DType::f16, GemmKernel::coopmat_emulated, true, l);
        Layout mixed = Layout::aligned();  // vector loads, fp32 A
        mixed.a_f32 = true;
        mixed.fragment = f;
        run({64, 72, 96, ta, tb, 1.0f, 0.0f}, DType::f16, GemmKernel::coopmat_emulated, true, mixed);
      }
  Layout bad;
  bad.fragment = {16, 16, 16, 512};  // 256 accumulator elements over 512 lanes
  gpu::Buffer buf = ctx().alloc(4096);
  EXPECT_THROW(ops::gemm_emulated(ctx(), {4, 4, 4, false, true}, {buf, DType::f16, 0, 4}, {buf, DType::f16, 0, 4},
                                  {buf, DType::f32, 0, 4}, bad.fragment),
               std::logic_error);
  ctx().free(buf);
}

TEST(KhrFragment, ChoosesTheLargestFp16Fp32SubgroupShape) {
  auto shape = [](uint32_t m, uint32_t n, uint32_t k, const char* a, const char* c, bool subgroup = true) {
    return gpu::CoopMatShape{m, n, k, a, a, c, c, subgroup};
  };
  // H200's list (docs/benchmarks.md): 16x16x16 f16 -> f32 among f16-accumulating and int shapes.
  const std::vector<gpu::CoopMatShape> h200 = {shape(16, 16, 16, "f16", "f16"), shape(16, 8, 16, "f16", "f16"),
                                               shape(16, 8, 8, "f16", "f32"),   shape(16, 16, 16, "f16", "f32"),
                                               shape(16, 8, 16, "f16", "f32"),  shape(16, 16, 32, "u8", "u32")};
  gpu::KhrFragment f = gpu::choose_khr_fragment(h200, 32);
  EXPECT_EQ(f.m, 16u);
  EXPECT_EQ(f.n, 16u);
  EXPECT_EQ(f.k, 16u);
  EXPECT_EQ(f.subgroup_size, 32u);
  // An Intel-like list: 8x16x16 at subgroup 16.
  f = gpu::choose_khr_fragment({shape(8, 16, 16, "f16", "f32"), shape(8, 8, 16, "f16", "f32", false)}, 16);
  EXPECT_EQ(f.m, 8u);
  EXPECT_EQ(f.n, 16u);
  // Nothing usable: only f16 accumulation, a side that is not 8/16/32, or too few elements per lane.
  EXPECT_EQ(gpu::choose_khr_fragment({shape(16, 16, 16, "f16", "f16")}, 32).m, 0u);
  EXPECT_EQ(gpu::choose_khr_fragment({shape(16, 16, 12, "f16", "f32")}, 32).m, 0u);
  EXPECT_EQ(gpu::choose_khr_fragment({shape(8, 8, 16, "f16", "f32")}, 128).m, 0u);
}

// The real KHR and NV2 kernels where the device has them (not lavapipe).
TEST_F(GemmTest, KhrCoopmatBitExactAndRandom) {
  if (!ops::gemm_kernel_available(ctx(), GemmKernel::khr_coopmat))
    GTEST_SKIP() << "no usable KHR cooperative matrix on " << ctx().info().name;
  family_suite(GemmKernel::khr_coopmat);
}

TEST_F(GemmTest, NvCoopmat2BitExactAndRandom) {
  if (!ops::gemm_kernel_available(ctx(), GemmKernel::nv_coopmat2))
    GTEST_SKIP() << "no usable NV cooperative matrix 2 on " << ctx().info().name;
  family_suite(GemmKernel::nv_coopmat2);
  // K >= 8192 with few output tiles: NV2's automatic split-K (two slices, the second shorter).
  run({256, 384, 8256, false, true, 1.0f, 0.0f}, DType::f16, GemmKernel::nv_coopmat2, true, Layout::aligned());
  run({256, 384, 8256, false, false, 1.0f, 0.5f}, DType::f16, GemmKernel::nv_coopmat2, false, Layout::aligned());
}

// Operands larger than maxStorageBufferRange are split into several dispatches. Only on
// devices where the range is small enough to test cheaply (lavapipe: 128 MiB).
// Split-K (ops/gemm.h): slices of K multiplied as a batch into a scratch and summed into C with
// beta. Forced slice counts that leave a shorter last slice (1000 = 2 x 336 + 328 with 3 slices)
// or more slices than whole K tiles; every kernel; exact values must stay bit-exact (the sums are
// exact whatever their order), random ones within the fp32 tolerance.
TEST_F(GemmTest, SplitKAllTransposesAndKernels) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (uint32_t slices : {3u, 5u, 64u})
        for (const Case& c : {Case{16, 70, 1000, ta, tb, 1.0f, 0.0f}, Case{33, 5, 40, ta, tb, -0.5f, 1.0f}}) {
          Layout l;
          l.split_k = slices;
          run(c, DType::f32, GemmKernel::scalar, true, l);
          run(c, DType::f32, GemmKernel::scalar, false, l);
          Layout h = l;
          h.lda_pad = 8;
          run(c, DType::f16, GemmKernel::scalar, false, h);
          run(c, DType::f16, GemmKernel::coopmat_emulated, false, h);
          h.a_f32 = true;
          run(c, DType::f16, GemmKernel::coopmat_emulated, true, h);
        }
}

// fp16 copies of C made with the product (ops::GemmF16Copy): a split product's summing kernel
// writes them (gemm_split_k_f16), another product is followed by to_f16_block. Each copy holds
// C rounded to nearest even in its first N columns and zeros up to its width; everything else in
// its buffer (the columns before the block, those past its width, the rows' tails) is untouched.
// C itself is the one the product without copies writes, bit for bit.
TEST_F(GemmTest, Fp16CopiesOfTheProduct) {
  const uint32_t m = 37, n = 16, k = 600;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(uint64_t(m) * k), b(uint64_t(k) * n);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  gpu::Buffer ga = ctx().alloc(a.size() * 4), gb = ctx().alloc(b.size() * 4), gc = ctx().alloc(uint64_t(m) * n * 4),
              want_c = ctx().alloc(uint64_t(m) * n * 4);
  ctx().upload(ga, a);
  ctx().upload(gb, b);
  // copy 0: beside 40 other columns, width 24 of a 70-half row; copy 1: at half 6 of 24-half rows
  const uint32_t ld0 = 70, ld1 = 24;
  const uint16_t mark = 0x7bff;  // 65504: not a value a copy writes here
  gpu::Buffer d0 = ctx().alloc(uint64_t(m) * ld0 * 2), d1 = ctx().alloc(uint64_t(m) * ld1 * 2 + 16);
  // The emulated cooperative-matrix kernel on fp16 operands too (LoRA's thin products run on
  // that family's kernels).
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = io::float_to_f16(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = io::float_to_f16(b[i]);
  gpu::Buffer ga16 = ctx().alloc(a16.size() * 2), gb16 = ctx().alloc(b16.size() * 2);
  ctx().upload(ga16, a16);
  ctx().upload(gb16, b16);
  for (GemmKernel kernel : {GemmKernel::automatic, GemmKernel::coopmat_emulated})
  for (uint32_t slices : {1u, 6u})
    for (size_t count : {size_t{1}, size_t{2}}) {
      SCOPED_TRACE("slices " + std::to_string(slices) + ", copies " + std::to_string(count) + ", kernel " +
                   ops::gemm_kernel_name(kernel));
      ops::GemmShape s{m, n, k};
      s.split_k = slices;
      const bool f16 = kernel == GemmKernel::coopmat_emulated;
      const ops::MatrixView va = f16 ? ops::MatrixView{ga16, DType::f16, 0, k} : ops::MatrixView{ga, DType::f32, 0, k};
      const ops::MatrixView vb = f16 ? ops::MatrixView{gb16, DType::f16, 0, n} : ops::MatrixView{gb, DType::f32, 0, n};
      ops::gemm(ctx(), s, va, vb, {want_c, DType::f32, 0, n}, kernel);
      ctx().upload(d0, std::vector<uint16_t>(uint64_t(m) * ld0, mark));
      ctx().upload(d1, std::vector<uint16_t>(uint64_t(m) * ld1 + 8, mark));
      const ops::GemmF16Copy copies[] = {{d0, 40, ld0, 24}, {d1, 6, ld1, n}};
      ops::gemm(ctx(), s, va, vb, {gc, DType::f32, 0, n}, kernel, std::span(copies, count));
      const std::vector<float> c = ctx().download<float>(gc, uint64_t(m) * n);
      EXPECT_EQ(c, ctx().download<float>(want_c, uint64_t(m) * n));
      const std::vector<uint16_t> h0 = ctx().download<uint16_t>(d0, uint64_t(m) * ld0),
                                  h1 = ctx().download<uint16_t>(d1, uint64_t(m) * ld1 + 8);
      for (uint32_t r = 0; r < m; ++r) {
        for (uint32_t j = 0; j < ld0; ++j) {
          const uint16_t want = j < 40 || j >= 64 ? mark : j < 56 ? io::float_to_f16(c[r * n + j - 40]) : uint16_t{0};
          ASSERT_EQ(h0[r * ld0 + j], want) << "copy 0, row " << r << " column " << j;
        }
        for (uint32_t j = 0; j < ld1; ++j) {
          const uint16_t want = count < 2 || j < 6 || j >= 6 + n ? mark : io::float_to_f16(c[r * n + j - 6]);
          ASSERT_EQ(h1[r * ld1 + j], want) << "copy 1, row " << r << " column " << j;
        }
      }
    }
  ops::GemmShape odd{m, 15, k};  // an odd N: the summing kernel stores pairs
  odd.split_k = 6;
  EXPECT_THROW(ops::gemm(ctx(), odd, {ga, DType::f32, 0, k}, {gb, DType::f32, 0, n},
                         {gc, DType::f32, 0, n}, GemmKernel::automatic,
                         std::vector<ops::GemmF16Copy>{{d0, 41, ld0, 24}}),
               std::logic_error);
  for (auto& x : {ga, gb, gc, want_c, d0, d1, ga16, gb16}) ctx().free(x);
}

TEST_F(GemmTest, SplitKOnlyForFewTilesWithLongK) {
  auto slices = [](uint32_t m, uint32_t n, uint32_t k, uint32_t batch = 1, uint32_t forced = 0) {
    ops::GemmShape s{m, n, k};
    s.batch = batch;
    s.split_k = forced;
    return ops::gemm_split_k_slices(s);
  };
  EXPECT_GT(slices(2048, 16, 2560), 1u);  // LoRA x A^T at Qwen3-4B's width
  EXPECT_GT(slices(16, 2560, 2048), 1u);  // LoRA dA = dt^T x
  EXPECT_GT(slices(9728, 16, 16384), 1u);  // LoRA dB of gate_proj at 8 x 2048 tokens: 152 tiles
  EXPECT_GT(slices(16384, 48, 2560), 1u);  // x [A_q; A_k; A_v]^T at 8 x 2048 tokens: 256 tiles
  EXPECT_EQ(slices(65536, 16, 2560), 1u);  // a thin product with 1024 tiles already
  EXPECT_EQ(slices(2048, 128, 2560), 1u);  // not thin: 64 tiles are enough
  EXPECT_EQ(slices(2048, 16, 16), 1u);    // short K: nothing to split
  EXPECT_EQ(slices(2048, 2048, 2560), 1u);  // enough tiles already
  EXPECT_EQ(slices(2048, 16, 2560, 2), 1u);  // batched products are not split
  EXPECT_EQ(slices(64, 64, 100, 1, 4), 4u);  // forced
  EXPECT_EQ(slices(64, 64, 100000, 1, 1), 1u);  // forced off
  // Few tiles but the scratch would be large: the slices stop at 32 MiB of partial products.
  EXPECT_LE(slices(2048, 1024, 100000) * 2048ull * 1024 * 4, 32ull << 20);
}

TEST(GemmTileChoice, CoopTilePassesOverMostlyEmptyLastWaves) {
  auto tile = [](uint32_t m, uint32_t n, uint32_t compute_units, uint32_t batch = 1) {
    ops::GemmShape s{m, n, 2560};
    s.batch = batch;
    const ops::CoopTileSize t = ops::gemm_coop_tile_size(s, compute_units);
    return std::to_string(t.rows) + "x" + std::to_string(t.cols);
  };
  // Unknown compute units: the largest tile with enough workgroups, as before.
  EXPECT_EQ(tile(2048, 2560, 0), "256x128");
  EXPECT_EQ(tile(2048, 1024, 0), "128x128");
  // 132 SMs (H200): 2048 x 2560 gives 160 groups of 256x128 (the second wave 21% busy) and 320
  // of 128x128 (third wave 42%): the 64x64 tile.
  EXPECT_EQ(tile(2048, 2560, 132), "64x64");
  EXPECT_EQ(tile(2048, 4096, 132), "256x128");  // 256 groups: two waves, 97% busy
  EXPECT_EQ(tile(2048, 9728, 132), "256x128");  // 608 groups: five waves, 92%
  EXPECT_EQ(tile(2048, 1024, 132), "128x128");  // 128 groups: one wave
  EXPECT_EQ(tile(512, 2048, 132, 32), "256x128");  // attention scores, 32 heads: 1024 groups
  EXPECT_EQ(tile(128, 128, 132), "64x64");       // too few groups for any larger tile
}

TEST_F(GemmTest, SplitsOperandsLargerThanTheBindingLimit) {
  const uint64_t range = ctx().info().max_storage_buffer_range;
  if (range > (256ull << 20)) GTEST_SKIP() << "binding limit " << range << " too large to exceed cheaply";
  const uint32_t k = 64;
  const uint32_t n = static_cast<uint32_t>(range / (k * 4) + 1000);  // B (fp32 [n, k]) exceeds the range
  run({3, n, k, false, true, 1.0f, 0.0f}, DType::f32, GemmKernel::scalar, true);
}

}  // namespace
}  // namespace forja::test
