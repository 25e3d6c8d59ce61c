// NF4 on the GPU (ops/nf4.h): dequantisation bit-identical to the CPU (quant::nf4_dequantize)
// with and without double quantisation, and the fused products y = x W^T and dx = dy W against
// a double-precision product with the CPU-dequantised weight, on shapes that are not tile
// multiples (odd numel included), with sentinels around the outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "io/float16.h"
#include "quant/nf4.h"
#include "ops/nf4.h"
#include "support/gpu_fixture.h"

namespace forja::test {
namespace {

using ops::DType;
using ops::GemmKernel;

constexpr float kSentinel = -12345.0f;
constexpr uint64_t kPad = 256;  // sentinel floats before and after every output (1 KiB: aligned)

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Weight values of varied scale per row (so absmax varies from block to block), with one row of
// zeros (an all-zero block) when there are enough rows.
std::vector<float> random_weight(uint32_t rows, uint32_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(size_t(rows) * cols);
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t c = 0; c < cols; ++c)
      w[size_t(r) * cols + c] = rows > 4 && r == 3 ? 0.0f : normal(rng) * (0.02f + 0.1f * float(r % 7));
  return w;
}

// Values in {-1, 0, 1} with at least one +-1 in every block of 64: every absmax is exactly 1 and
// the dequantised weight equals the values (no double quantisation).
std::vector<float> ternary_weight(uint32_t rows, uint32_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(-1, 1);
  std::vector<float> w(size_t(rows) * cols);
  for (size_t e = 0; e < w.size(); ++e) w[e] = e % 64 == 0 ? 1.0f : float(pick(rng));
  return w;
}

class Nf4GpuTest : public GpuTest {
 protected:
  // An fp32 buffer holding `count` values after kPad sentinels, kPad sentinels after them; returns
  // the whole buffer and (through `view`) the inner range.
  gpu::Buffer padded(const std::vector<float>& values, gpu::Buffer& view) {
    std::vector<float> host(values.size() + 2 * kPad, kSentinel);
    std::copy(values.begin(), values.end(), host.begin() + kPad);
    gpu::Buffer b = ctx().alloc(host.size() * 4);
    ctx().upload(b, host);
    view = b.slice(kPad * 4, values.size() * 4);
    return b;
  }
  // Downloads a padded buffer, checks the sentinels and returns the inner values.
  std::vector<float> unpad(const gpu::Buffer& b, size_t count) {
    std::vector<float> host = ctx().download<float>(b, count + 2 * kPad);
    size_t bad = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      if (i >= kPad && i < kPad + count) continue;
      if (host[i] != kSentinel && bad++ < 5) ADD_FAILURE() << "write outside the output at " << i;
    }
    return std::vector<float>(host.begin() + kPad, host.begin() + kPad + count);
  }

  void check_dequantize(uint32_t rows, uint32_t cols, bool double_quant, uint32_t seed = 1) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + (double_quant ? " double quant" : ""));
    const std::vector<float> w = random_weight(rows, cols, seed);
    const quant::Nf4Tensor t = quant::nf4_quantize(w, {rows, cols}, {double_quant, 0});
    const std::vector<float> want = quant::nf4_dequantize(t);
    ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
    EXPECT_EQ(gw.rows, rows);
    EXPECT_EQ(gw.cols, cols);
    gpu::Buffer out_view;
    gpu::Buffer out = padded(std::vector<float>(want.size(), kSentinel), out_view);
    ops::nf4_dequantize(ctx(), gw, out_view);
    const std::vector<float> got = unpad(out, want.size());
    ops::free_nf4(ctx(), gw);
    ctx().free(out);
    size_t bad = 0;
    for (size_t e = 0; e < want.size(); ++e)
      if (bits(got[e]) != bits(want[e]) && bad++ < 5)
        ADD_FAILURE() << "element " << e << ": " << got[e] << ", want " << want[e];
    EXPECT_EQ(bad, 0u);
  }

  // forward: y [m, rows] = alpha x [m, cols] W^T + beta y; else dx [m, cols] = alpha dy [m, rows] W + beta dx.
  void check_gemm(bool forward, uint32_t m, uint32_t rows, uint32_t cols, bool double_quant, float alpha, float beta,
                  GemmKernel kernel, DType operands, bool exact_values, uint32_t seed = 1) {
    SCOPED_TRACE(std::string(forward ? "x W^T" : "dy W") + " m " + std::to_string(m) + " W " + std::to_string(rows) +
                 "x" + std::to_string(cols) + (double_quant ? " dq" : "") + " alpha " + std::to_string(alpha) +
                 " beta " + std::to_string(beta) + " " + ops::gemm_kernel_name(kernel) +
                 (operands == DType::f16 ? " f16" : " f32") + (exact_values ? " exact" : ""));
    const bool half = operands == DType::f16;
    const std::vector<float> w = exact_values ? ternary_weight(rows, cols, seed) : random_weight(rows, cols, seed);
    const quant::Nf4Tensor t = quant::nf4_quantize(w, {rows, cols}, {double_quant, 0});
    std::vector<float> wd = quant::nf4_dequantize(t);
    if (exact_values) {
      for (size_t e = 0; e < w.size(); ++e) ASSERT_EQ(wd[e], w[e]);
    }
    if (half)  // fp16 operands: W rounded to fp16 on load
      for (float& v : wd) v = io::f16_to_float(io::float_to_f16(v));

    const uint32_t k = forward ? cols : rows, n = forward ? rows : cols;
    std::mt19937 rng(seed + 100);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 3);
    const float exact[4] = {-0.5f, 0.0f, 0.5f, 1.0f};
    auto draw = [&] { return exact_values ? exact[pick(rng)] : uni(rng); };
    // fp16 operands: the kernel rounds x (dy) as it loads it; the reference multiplies the rounded values
    auto operand = [&](float v) { return half ? double(io::f16_to_float(io::float_to_f16(v))) : double(v); };
    std::vector<float> a(size_t(m) * k), c(size_t(m) * n);
    for (float& v : a) v = draw();
    for (float& v : c) v = beta != 0.0f ? draw() : std::nanf("");

    std::vector<double> want(c.size());
    for (uint32_t i = 0; i < m; ++i)
      for (uint32_t j = 0; j < n; ++j) {
        double s = 0;
        for (uint32_t q = 0; q < k; ++q) {
          const double wv = forward ? wd[size_t(j) * cols + q] : wd[size_t(q) * cols + j];
          s += operand(a[size_t(i) * k + q]) * wv;
        }
        want[size_t(i) * n + j] = alpha * s + (beta != 0.0f ? beta * double(c[size_t(i) * n + j]) : 0.0);
      }

    ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
    gpu::Buffer a_view, c_view;
    gpu::Buffer ga = padded(a, a_view), gc = padded(c, c_view);
    if (forward)
      ops::nf4_gemm_xwt(ctx(), a_view, gw, c_view, m, alpha, beta, operands, kernel);
    else
      ops::nf4_gemm_dyw(ctx(), a_view, gw, c_view, m, alpha, beta, operands, kernel);
    const std::vector<float> got = unpad(gc, c.size());
    ops::free_nf4(ctx(), gw);
    ctx().free(ga);
    ctx().free(gc);

    // fp32 accumulation of k terms of magnitude <= ~1: error grows like k * eps32.
    const double tol = exact_values ? 0.0 : 1e-6 * (k + 4) * (std::abs(alpha) + std::abs(beta) + 1);
    size_t bad = 0;
    for (size_t e = 0; e < got.size(); ++e)
      if (!(std::abs(got[e] - want[e]) <= tol) && bad++ < 5)
        ADD_FAILURE() << "out[" << e / n << "," << e % n << "] = " << got[e] << ", want " << want[e];
    EXPECT_EQ(bad, 0u);
  }

  void gemm_suite(GemmKernel kernel, DType operands) {
    for (bool forward : {true, false})
      for (bool dq : {false, true}) {
        check_gemm(forward, 1, 96, 72, dq, 1.0f, 0.0f, kernel, operands, false);
        check_gemm(forward, 17, 96, 72, dq, 1.0f, 0.0f, kernel, operands, false);
        check_gemm(forward, 33, 7, 9, dq, -0.5f, 1.0f, kernel, operands, false);  // numel 63: odd
        check_gemm(forward, 70, 130, 200, dq, 2.0f, 0.5f, kernel, operands, false);
        check_gemm(forward, 5, 64, 1100, dq, 1.0f, 0.0f, kernel, operands, false);  // > 256 blocks: 2 nested
      }
    for (bool forward : {true, false}) {
      check_gemm(forward, 65, 96, 72, false, 1.0f, 0.0f, kernel, operands, true);
      check_gemm(forward, 3, 7, 9, false, 1.0f, 0.0f, kernel, operands, true);
      check_gemm(forward, 130, 128, 192, false, 0.5f, 1.0f, kernel, operands, true);
    }
  }
};

TEST_F(Nf4GpuTest, DequantizeMatchesCpuExactly) {
  for (bool dq : {false, true}) {
    check_dequantize(1, 1, dq);
    check_dequantize(7, 9, dq);  // numel 63: odd, one partial block
    check_dequantize(96, 72, dq);
    check_dequantize(3, 1000, dq);
    check_dequantize(300, 100, dq);  // 469 blocks: two nested absmax blocks
    check_dequantize(256, 1100, dq, 7);
  }
}

// The fp16 dequantisation (mixed precision's scratch weight) is the CPU dequantisation rounded
// to nearest even, and writes nothing past rows x cols.
// A bitsandbytes checkpoint brings its own 8-bit absmax map (model/bnb4.h): the GPU must decode
// with the tensor's table, not forja's built-in one. A table scaled by 1 + 2^-7 changes every
// decoded absmax, so using the wrong one cannot go unnoticed.
TEST_F(Nf4GpuTest, DequantizeUsesTheTensorsOwnAbsmaxTable) {
  const uint32_t rows = 80, cols = 320;  // 400 blocks: two nested blocks
  quant::Nf4Tensor t = quant::nf4_quantize(random_weight(rows, cols, 9), {rows, cols}, {true, 0});
  const std::vector<float> builtin = quant::nf4_dequantize(t);
  for (float v : quant::dynamic_map_signed()) t.code8.push_back(v * (1.0f + 1.0f / 128.0f));
  const std::vector<float> want = quant::nf4_dequantize(t);
  ASSERT_NE(want, builtin);
  ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
  gpu::Buffer out_view;
  gpu::Buffer out = padded(std::vector<float>(want.size(), kSentinel), out_view);
  ops::nf4_dequantize(ctx(), gw, out_view);
  const std::vector<float> got = unpad(out, want.size());
  ops::free_nf4(ctx(), gw);
  ctx().free(out);
  size_t bad = 0;
  for (size_t e = 0; e < want.size(); ++e)
    if (bits(got[e]) != bits(want[e]) && bad++ < 5) ADD_FAILURE() << "element " << e << ": " << got[e] << ", want " << want[e];
  EXPECT_EQ(bad, 0u);
}

TEST_F(Nf4GpuTest, DequantizeToF16IsTheCpuValueRounded) {
  const uint32_t shapes[][2] = {{96, 72}, {3, 1000}, {300, 100}, {256, 1100}, {1, 8}, {64, 96}, {33, 2560}};
  for (bool dq : {false, true})
    for (const auto& shape : shapes) {
      const uint32_t rows = shape[0], cols = shape[1];
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + (dq ? " double quant" : ""));
      const quant::Nf4Tensor t = quant::nf4_quantize(random_weight(rows, cols, 3), {rows, cols}, {dq, 0});
      const std::vector<float> want = quant::nf4_dequantize(t);
      ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
      const uint16_t sentinel = 0x7e00;  // a NaN no value rounds to
      std::vector<uint16_t> init(want.size() + 16, sentinel);
      gpu::Buffer out = ctx().alloc(init.size() * 2);
      ctx().upload(out, init);
      ops::nf4_dequantize(ctx(), gw, out, DType::f16);
      const std::vector<uint16_t> got = ctx().download<uint16_t>(out, init.size());
      ops::free_nf4(ctx(), gw);
      ctx().free(out);
      size_t bad = 0;
      for (size_t e = 0; e < got.size(); ++e) {
        const uint16_t expect = e < want.size() ? io::float_to_f16(want[e]) : sentinel;
        if (got[e] != expect && bad++ < 5) ADD_FAILURE() << "element " << e << ": " << got[e] << ", want " << expect;
      }
      EXPECT_EQ(bad, 0u);
    }
}

// With a row stride (room beside each row for a LoRA factor, model/transformer.cpp): each row
// lands at r * ld, the columns between rows are left as they were.
TEST_F(Nf4GpuTest, DequantizeToF16WithARowStrideLeavesTheGapsAlone) {
  const uint32_t shapes[][3] = {{96, 72, 136}, {3, 1000, 1064}, {17, 8, 16}, {40, 264, 272}, {48, 160, 224}};
  for (const auto& shape : shapes) {
    const uint32_t rows = shape[0], cols = shape[1], ld = shape[2];
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " ld " + std::to_string(ld));
    const quant::Nf4Tensor t = quant::nf4_quantize(random_weight(rows, cols, 5), {rows, cols}, {true, 0});
    const std::vector<float> want = quant::nf4_dequantize(t);
    ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
    const uint16_t sentinel = 0x7e00;
    std::vector<uint16_t> init(size_t(rows) * ld + 16, sentinel);
    gpu::Buffer out = ctx().alloc(init.size() * 2);
    ctx().upload(out, init);
    ops::nf4_dequantize(ctx(), gw, out, DType::f16, ld);
    const std::vector<uint16_t> got = ctx().download<uint16_t>(out, init.size());
    ops::free_nf4(ctx(), gw);
    ctx().free(out);
    size_t bad = 0;
    for (size_t e = 0; e < got.size(); ++e) {
      const size_t r = e / ld, c = e % ld;
      const uint16_t expect = r < rows && c < cols ? io::float_to_f16(want[r * cols + c]) : sentinel;
      if (got[e] != expect && bad++ < 5) ADD_FAILURE() << "element " << e << ": " << got[e] << ", want " << expect;
    }
    EXPECT_EQ(bad, 0u);
  }
  // fp32 output, or a stride that is not a multiple of 8, is refused
  const quant::Nf4Tensor t = quant::nf4_quantize(random_weight(8, 16, 1), {8, 16}, {false, 0});
  ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
  gpu::Buffer out = ctx().alloc(4096);
  EXPECT_THROW(ops::nf4_dequantize(ctx(), gw, out, DType::f32, 24), std::logic_error);
  EXPECT_THROW(ops::nf4_dequantize(ctx(), gw, out, DType::f16, 20), std::logic_error);
  ops::free_nf4(ctx(), gw);
  ctx().free(out);
}

// The LoRA factor written beside W by the same dispatch (ops::Nf4Beside): scale * B in the
// columns right of each row (the forward's [W | s B], at a lead column among other factors'
// columns) and A's rows below W with zero rows up to the fold (the backward's [W ; A]), from a
// source at an offset with its own row stride; what the block does not cover keeps its old values.
TEST_F(Nf4GpuTest, DequantizeToF16WritesTheBlockBesideW) {
  struct Case {
    uint32_t rows, cols, ld;  // W and the output's row stride
    bool below;               // A's rows below W, else B's columns beside it
    uint32_t r;               // the factor's rank (valid rows or columns)
    uint32_t lead = 0;        // B's first column in the block beside W
  };
  const Case cases[] = {{96, 72, 136, false, 5}, {40, 264, 272, true, 3}, {17, 8, 24, false, 16}, {24, 16, 24, true, 8},
                       {40, 256, 320, false, 16}, {24, 128, 136, true, 8}, {40, 256, 320, false, 16, 16},
                       {96, 72, 136, false, 5, 35}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (const Case& k : cases) {
    SCOPED_TRACE(std::to_string(k.rows) + "x" + std::to_string(k.cols) + (k.below ? " A below" : " B beside") + " at " +
                 std::to_string(k.lead));
    const quant::Nf4Tensor t = quant::nf4_quantize(random_weight(k.rows, k.cols, 9), {k.rows, k.cols}, {true, 0});
    const std::vector<float> w = quant::nf4_dequantize(t);
    const uint32_t fold = k.below ? 8 : k.ld - k.cols;  // zero-padded rows / columns up to this
    const uint32_t src_ld = k.below ? k.cols + 3 : k.r + 1, src_rows = k.below ? k.r : k.rows;
    const uint32_t src_first = 5;
    std::vector<float> src(src_first + size_t(src_rows) * src_ld);
    for (float& x : src) x = u(rng);
    ops::Nf4Beside beside;
    beside.src = ctx().alloc(src.size() * 4);
    ctx().upload(beside.src, src);
    beside.src_first = src_first, beside.src_ld = src_ld, beside.scale = k.below ? 1.0f : 0.75f, beside.lead = k.lead;
    if (k.below) {
      beside.dst_first = uint64_t(k.rows) * k.ld, beside.rows = fold, beside.width = k.cols;
      beside.valid_rows = k.r, beside.cols = k.cols;
    } else {
      beside.dst_first = k.cols, beside.rows = k.rows, beside.width = fold, beside.valid_rows = k.rows, beside.cols = k.r;
    }
    const uint32_t out_rows = k.rows + (k.below ? fold : 0);
    ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
    const uint16_t sentinel = 0x7e00;
    std::vector<uint16_t> init(size_t(out_rows) * k.ld + 16, sentinel);
    gpu::Buffer out = ctx().alloc(init.size() * 2);
    ctx().upload(out, init);
    ops::nf4_dequantize(ctx(), gw, out, DType::f16, k.ld, &beside);
    const std::vector<uint16_t> got = ctx().download<uint16_t>(out, init.size());
    ops::free_nf4(ctx(), gw);
    for (const gpu::Buffer& b : {out, beside.src}) ctx().free(b);
    size_t bad = 0;
    for (size_t e = 0; e < got.size(); ++e) {
      const size_t r = e / k.ld, c = e % k.ld;
      uint16_t expect = sentinel;
      if (r < k.rows && c < k.cols) {
        expect = io::float_to_f16(w[r * k.cols + c]);
      } else if (!k.below && r < k.rows && c < k.cols + fold) {  // zeros, scale * B[r][c - cols - lead], zeros
        const size_t j = c - k.cols;
        expect = io::float_to_f16(j >= k.lead && j < k.lead + k.r ? beside.scale * src[src_first + r * src_ld + j - k.lead]
                                                                   : 0.0f);
      } else if (k.below && r >= k.rows && r < out_rows && c < k.cols) {  // A[r - rows][c], then zero rows
        const size_t i = r - k.rows;
        expect = io::float_to_f16(i < k.r ? src[src_first + i * src_ld + c] : 0.0f);
      }
      if (got[e] != expect && bad++ < 5) ADD_FAILURE() << "element " << e << ": " << got[e] << ", want " << expect;
    }
    EXPECT_EQ(bad, 0u);
  }
}

TEST_F(Nf4GpuTest, DequantizeToF16RejectsSizesNotAMultipleOf8) {
  const quant::Nf4Tensor t = quant::nf4_quantize(random_weight(7, 9, 1), {7, 9}, {false, 0});
  ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
  gpu::Buffer out = ctx().alloc(256);
  EXPECT_THROW(ops::nf4_dequantize(ctx(), gw, out, DType::f16), std::logic_error);
  ops::free_nf4(ctx(), gw);
  ctx().free(out);
}

// Outputs larger than the binding limit are written in several dispatches. Only where the limit
// is small enough to exceed cheaply (lavapipe: 128 MiB).
TEST_F(Nf4GpuTest, DequantizeSplitsOutputsLargerThanTheBindingLimit) {
  const uint64_t range = ctx().info().max_storage_buffer_range;
  if (range > (256ull << 20)) GTEST_SKIP() << "binding limit " << range << " too large to exceed cheaply";
  const uint32_t cols = 4096, rows = static_cast<uint32_t>(range / 4 / cols + 3);
  std::vector<float> w(size_t(rows) * cols);
  for (size_t e = 0; e < w.size(); ++e) w[e] = float(int(e * 2654435761u % 2001) - 1000) * 1e-3f;
  const quant::Nf4Tensor t = quant::nf4_quantize(w, {rows, cols}, {true, 0});
  const std::vector<float> want = quant::nf4_dequantize(t);
  ops::Nf4Weight gw = ops::upload_nf4(ctx(), t);
  gpu::Buffer out = ctx().alloc(want.size() * 4);
  ops::nf4_dequantize(ctx(), gw, out);
  const std::vector<float> got = ctx().download<float>(out, want.size());
  ops::free_nf4(ctx(), gw);
  ctx().free(out);
  size_t bad = 0;
  for (size_t e = 0; e < want.size(); ++e)
    if (bits(got[e]) != bits(want[e]) && bad++ < 5) ADD_FAILURE() << "element " << e;
  EXPECT_EQ(bad, 0u);
}

TEST_F(Nf4GpuTest, ScalarFusedGemms) { gemm_suite(GemmKernel::scalar, DType::f32); }

// Mixed precision without cooperative matrices: the scalar kernel rounding x (dy) and W to fp16.
TEST_F(Nf4GpuTest, ScalarFusedGemmsF16Operands) { gemm_suite(GemmKernel::scalar, DType::f16); }

// fp32 operands mean fp32 arithmetic on every device: `automatic` must not pick a kernel that
// rounds to fp16 (the reference precision's parity depends on it). Random values in [-1, 1]:
// rounding them to fp16 would miss the fp32 tolerance by orders of magnitude.
TEST_F(Nf4GpuTest, AutomaticWithF32OperandsIsExactFp32) {
  EXPECT_EQ(ops::nf4_gemm_kernel_for(ctx(), DType::f32), GemmKernel::scalar);
  for (bool forward : {true, false}) check_gemm(forward, 150, 130, 200, true, 1.0f, 0.0f, GemmKernel::automatic,
                                                DType::f32, false);
}

// Both scalar tiles whatever the automatic choice, with fp32 and fp16-rounded operands; the
// suite's shapes take both the 4-element chunk loads (rows that are multiples of 4) and the
// element loads (7 x 9).
TEST_F(Nf4GpuTest, ScalarFusedGemmsEachTile) {
  for (GemmKernel kernel : {GemmKernel::scalar_t64, GemmKernel::scalar_t128})
    for (DType operands : {DType::f32, DType::f16}) gemm_suite(kernel, operands);
}

TEST_F(Nf4GpuTest, ScalarFusedGemmsLargeK) {
  check_gemm(true, 40, 64, 2560, true, 1.0f, 0.0f, GemmKernel::scalar, DType::f32, false);
  check_gemm(false, 40, 2560, 64, true, 1.0f, 0.0f, GemmKernel::scalar, DType::f32, false);
}

// The cooperative-matrix kernel's tiling, addressing and NF4 decoding, with the matrix
// operations emulated by scalar code (runs on any device, lavapipe included).
TEST_F(Nf4GpuTest, CoopmatEmulatedFusedGemms) { gemm_suite(GemmKernel::coopmat_emulated, DType::f16); }

TEST_F(Nf4GpuTest, CoopmatKernelsRejectF32Operands) {
  gpu::Buffer buf = ctx().alloc(4096);
  const std::vector<float> w = random_weight(8, 64, 1);
  ops::Nf4Weight gw = ops::upload_nf4(ctx(), quant::nf4_quantize(w, {8, 64}, {false, 0}));
  EXPECT_THROW(ops::nf4_gemm_xwt(ctx(), buf, gw, buf, 1, 1.0f, 0.0f, DType::f32, GemmKernel::coopmat_emulated),
               std::logic_error);
  ops::free_nf4(ctx(), gw);
  ctx().free(buf);
}

// The real cooperative-matrix kernel, where the device has one (not lavapipe).
TEST_F(Nf4GpuTest, CoopmatFusedGemms) {
  if (ops::nf4_gemm_kernel_for(ctx(), DType::f16) != GemmKernel::coopmat)
    GTEST_SKIP() << "no NV cooperative matrix 16x16x16 f16->f32 on " << ctx().info().name;
  gemm_suite(GemmKernel::coopmat, DType::f16);
  for (bool forward : {true, false}) {  // 128 x 128 tiles
    check_gemm(forward, 2048, 1024, 2560, true, 1.0f, 0.0f, GemmKernel::coopmat, DType::f16, false);
    check_gemm(forward, 1000, 2048, 1024, false, 1.0f, 0.0f, GemmKernel::coopmat, DType::f16, true);
  }
}

// Inputs and outputs larger than the binding limit are split over M. Only where the limit is
// small enough to exceed cheaply (lavapipe: 128 MiB).
TEST_F(Nf4GpuTest, FusedGemmsSplitRowsOverTheBindingLimit) {
  const uint64_t range = ctx().info().max_storage_buffer_range;
  if (range > (256ull << 20)) GTEST_SKIP() << "binding limit " << range << " too large to exceed cheaply";
  // The outputs [m, 64] exceed the range; K = 8 keeps the product cheap on lavapipe.
  const uint32_t m = static_cast<uint32_t>(range / (64 * 4) + 1000);
  check_gemm(true, m, 64, 8, false, 1.0f, 0.0f, GemmKernel::scalar, DType::f32, true);
  check_gemm(false, m, 8, 64, true, 1.0f, 0.5f, GemmKernel::scalar, DType::f32, false);
}

TEST_F(Nf4GpuTest, RejectsPackedWeightsOverTheBindingLimit) {
  quant::Nf4Tensor t;
  const uint64_t range = ctx().info().max_storage_buffer_range;
  if (range >= (1ull << 30)) GTEST_SKIP() << "binding limit " << range << " too large to exceed cheaply";
  t.numel = int64_t(range) * 2 + 128;
  t.shape = {t.numel / 64, 64};
  t.packed.resize(size_t(t.numel / 2));
  EXPECT_THROW(ops::upload_nf4(ctx(), t), std::logic_error);
}

}  // namespace
}  // namespace forja::test
