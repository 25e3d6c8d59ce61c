// Fused flash attention (ops/flash_attention.h) against the double-precision reference
// (ops/ref/attention_ref.h): forward out and lse, backward dq/dk/dv, on awkward shapes (S 37 and
// 130, not multiples of the tiles; head_dim 8 to 128, 33 and 40 not multiples of the 16-wide
// fragments; GQA 4/2 and 6/1), with plain causal masks
// and with 2-3 packed segments plus padding rows; tiles forced small and large; the backward
// against central finite differences of the reference forward; determinism; all-padding rows.
// Sentinels after every output catch writes past the end; outputs start as NaN so a row the
// kernel forgets to write fails.
//
// f32 (the tiling in fp32) must match the reference to fp32 accuracy. The fp16 variants
// (coopmat_emulated everywhere, coopmat where the device has it) round q, k, v and dout to fp16
// as they are staged; their reference gets the same rounded inputs, so what remains is the fp16
// rounding of P and dS (relative 2^-11) and fp32 accumulation, the tolerances of the GEMM path
// (test_attention.cpp), tight enough that a masking or tiling error (differences of order 1)
// cannot pass. FORJA_REF_VERBOSE=1 prints the worst errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>

#include "io/float16.h"
#include "ops/flash_attention.h"
#include "ops/ref/attention_ref.h"
#include "support/expect_close.h"
#include "support/gpu_buffers.h"

namespace forja::test {
namespace {

using ops::FlashAttentionOptions;
using ops::FlashKernel;

struct Shape {
  uint32_t batch, seq, nh, nkv, d;
  std::string name() const {
    return "B" + std::to_string(batch) + " S" + std::to_string(seq) + " nh" + std::to_string(nh) + " nkv" +
           std::to_string(nkv) + " d" + std::to_string(d);
  }
};

std::string options_name(const FlashAttentionOptions& o) {
  return ops::flash_kernel_name(o.kernel) + " tiles " +
         (o.block_q ? std::to_string(o.block_q) + "x" + std::to_string(o.block_k) : std::string("automatic")) +
         (o.dkdv_head_split ? " dkdv split " + std::to_string(o.dkdv_head_split) : std::string());
}

float round_f16(float x) { return io::f16_to_float(io::float_to_f16(x)); }

// Packed rows: 2-3 documents of random lengths per sequence, padding (0) between or after some,
// a different pattern per sequence, the last row padding.
std::vector<int32_t> packed_segments(const Shape& s, std::mt19937& rng) {
  std::vector<int32_t> seg(size_t(s.batch) * s.seq, 0);
  if (s.seq < 4) return std::vector<int32_t>(seg.size(), 1);
  for (uint32_t b = 0; b < s.batch; ++b) {
    const uint32_t docs = 2 + (b % 2);
    // Cut points in [1, seq - 1): documents [cut_i, cut_{i+1}), with a short gap of padding
    // after the first document in odd sequences.
    std::vector<uint32_t> cuts{0};
    std::uniform_int_distribution<uint32_t> pos(1, s.seq - 2);
    while (cuts.size() < docs) cuts.push_back(pos(rng));
    std::sort(cuts.begin(), cuts.end());
    cuts.push_back(s.seq - 1);  // the last row stays padding
    for (uint32_t d = 0; d < docs; ++d) {
      uint32_t begin = cuts[d], end = cuts[d + 1];
      if (b % 2 == 1 && d == 1) begin = std::min(end, begin + 3);  // padding gap
      for (uint32_t i = begin; i < end; ++i) seg[size_t(b) * s.seq + i] = int32_t(1 + d + 10 * b);
    }
  }
  return seg;
}

class FlashAttentionTest : public GpuBufferTest {
 protected:
  FlashAttentionTest() : GpuBufferTest(11) {}

  // |got - want| <= rtol (1 + |want|); -inf must match exactly. Returns the worst error.
  static double expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                           double rtol) {
    return test::expect_close_rel(what, got, want, rtol);
  }

  // Forward and backward on the GPU and the reference; compares out, lse, dq, dk, dv.
  void check(const Shape& s, const std::vector<int32_t>& seg, const FlashAttentionOptions& o) {
    SCOPED_TRACE(s.name() + " " + options_name(o));
    if (std::getenv("FORJA_REF_VERBOSE")) {
      const ops::FlashTiles t = ops::flash_attention_tiles(ctx(), s.d, o);
      std::fprintf(stderr, "%s %s (fwd %ux%u, dq %ux%u, dkdv %ux%u) %s\n", s.name().c_str(), options_name(o).c_str(),
                   t.fwd_q, t.fwd_k, t.dq_q, t.dq_k, t.dkdv_q, t.dkdv_k, seg[0] == 1 && seg.back() == 1 ? "causal" : "packed");
    }
    const size_t nq = size_t(s.batch) * s.seq * s.nh * s.d, nkv = size_t(s.batch) * s.seq * s.nkv * s.d;
    const size_t nstat = size_t(s.batch) * s.seq * s.nh;
    const float scale = 1.0f / std::sqrt(float(s.d));
    auto q = random(nq), k = random(nkv), v = random(nkv), dout = random(nq);
    // Larger q so the softmax is peaked, not nearly uniform (a mask error then shows clearly),
    // and the running maximum moves across key tiles (the lazy rescaling runs).
    for (auto& x : q) x *= 3.0f;

    auto gq = upload(q), gk = upload(k), gv = upload(v), gseg = upload(seg, 0), gdo = upload(dout);
    auto gout = output(nq), glse = output(nstat), gdq = output(nq), gdk = output(nkv), gdv = output(nkv);
    ops::flash_attention_forward(ctx(), gq, gk, gv, gseg, gout, glse, s.batch, s.seq, s.nh, s.nkv, s.d, scale, o);
    ops::flash_attention_backward(ctx(), gq, gk, gv, gseg, gout, glse, gdo, gdq, gdk, gdv, s.batch, s.seq, s.nh,
                                  s.nkv, s.d, scale, o);

    const bool f16 = o.kernel != FlashKernel::f32;
    if (f16)
      for (auto* x : {&q, &k, &v, &dout})
        for (float& e : *x) e = round_f16(e);
    std::vector<double> qd = to_double(q), kd = to_double(k), vd = to_double(v), dod = to_double(dout);
    std::vector<double> out(nq), lse(nstat), dq(nq), dk(nkv), dv(nkv);
    ref::attention_forward(out.data(), lse.data(), qd.data(), kd.data(), vd.data(), seg.data(), s.batch, s.seq, s.nh,
                           s.nkv, s.d);
    ref::attention_backward(dq.data(), dk.data(), dv.data(), dod.data(), qd.data(), kd.data(), vd.data(), out.data(),
                            lse.data(), seg.data(), s.batch, s.seq, s.nh, s.nkv, s.d);
    // The reference's lse is [B, S, nh]; the op's is [B, nh, S].
    std::vector<double> lse_t(nstat);
    for (uint32_t b = 0; b < s.batch; ++b)
      for (uint32_t i = 0; i < s.seq; ++i)
        for (uint32_t h = 0; h < s.nh; ++h)
          lse_t[(size_t(b) * s.nh + h) * s.seq + i] = lse[(size_t(b) * s.seq + i) * s.nh + h];

    const double tol_out = f16 ? 2e-3 : 2e-5, tol_lse = f16 ? 1e-5 : 2e-5, tol_grad = f16 ? 4e-3 : 1e-4;
    expect_close("out", result(gout, nq), out, tol_out);
    expect_close("lse", result(glse, nstat), lse_t, tol_lse);
    expect_close("dq", result(gdq, nq), dq, tol_grad);
    expect_close("dk", result(gdk, nkv), dk, tol_grad);
    expect_close("dv", result(gdv, nkv), dv, tol_grad);
  }

  void check_both_masks(const Shape& s, const FlashAttentionOptions& o) {
    if (!ops::flash_attention_supports(ctx(), s.d, o)) {
      std::fprintf(stderr, "  skipped %s %s: not supported on this device\n", s.name().c_str(), options_name(o).c_str());
      return;
    }
    check(s, std::vector<int32_t>(size_t(s.batch) * s.seq, 1), o);
    check(s, packed_segments(s, rng_), o);
  }
};

// The shapes: S 37 and 130, head_dim 64 and 128, GQA 4/2 and 6/1; and small head dims,
// padded to the fragments (8 -> 16, 33 -> 48).
const Shape kShapes[] = {{2, 37, 4, 2, 64}, {1, 130, 6, 1, 64}, {2, 37, 6, 1, 128}, {1, 130, 4, 2, 128},
                         {2, 33, 4, 4, 16}, {1, 1, 2, 1, 32},   {2, 21, 3, 1, 8},   {1, 40, 4, 2, 33}};

TEST_F(FlashAttentionTest, F32MatchesReference) {
  // fp32 operand tiles are twice as large: at head_dim 128 the backward needs more than
  // lavapipe's 32 KiB (checked by check_both_masks, which says so).
  for (const Shape& s : kShapes) check_both_masks(s, {FlashKernel::f32, 0, 0});
}

TEST_F(FlashAttentionTest, F32SmallAndLargeTilesMatchReference) {
  for (const Shape& s : {Shape{2, 37, 4, 2, 16}, Shape{1, 130, 6, 1, 32}}) {
    check_both_masks(s, {FlashKernel::f32, 16, 16});
    check_both_masks(s, {FlashKernel::f32, 32, 16});
    check_both_masks(s, {FlashKernel::f32, 16, 32});
    check_both_masks(s, {FlashKernel::f32, 64, 64});
  }
}

TEST_F(FlashAttentionTest, EmulatedCoopmatMatchesReference) {
  for (const Shape& s : kShapes) check_both_masks(s, {FlashKernel::coopmat_emulated, 0, 0});
}

TEST_F(FlashAttentionTest, EmulatedCoopmatSmallTilesMatchReference) {
  for (const Shape& s : {Shape{2, 37, 4, 2, 64}, Shape{1, 70, 4, 2, 128}})
    check_both_masks(s, {FlashKernel::coopmat_emulated, 16, 16});
}

// The dk/dv kernel with a kv head's query heads split over several workgroups (partial dk, dv
// summed by flash_sum_parts): 6/1 heads in 3 and 6 parts, 4/2 in 2.
TEST_F(FlashAttentionTest, DkdvHeadSplitMatchesReference) {
  for (uint32_t parts : {3u, 6u}) check_both_masks({2, 37, 6, 1, 64}, {FlashKernel::coopmat_emulated, 0, 0, parts});
  check_both_masks({1, 130, 4, 2, 128}, {FlashKernel::coopmat_emulated, 0, 0, 2});
  check({2, 37, 6, 1, 32}, packed_segments({2, 37, 6, 1, 32}, rng_), {FlashKernel::f32, 0, 0, 2});
}

// The real cooperative-matrix kernels, where the device has them (NVIDIA).
TEST_F(FlashAttentionTest, CoopmatMatchesReference) {
  if (!ops::flash_attention_coopmat_available(ctx())) GTEST_SKIP() << "no NV cooperative matrices on this device";
  for (const Shape& s : kShapes) check_both_masks(s, {FlashKernel::coopmat, 0, 0});
  for (const Shape& s : kShapes) check_both_masks(s, {FlashKernel::coopmat, 16, 16});
  check_both_masks({2, 37, 6, 1, 128}, {FlashKernel::coopmat, 0, 0, 3});
}

// The backward against central differences of the double reference forward:
// L = sum(dout * out), dL/dx for a sample of q, k and v elements.
TEST_F(FlashAttentionTest, BackwardMatchesFiniteDifferences) {
  const Shape s{1, 37, 4, 2, 16};
  const size_t nq = size_t(s.seq) * s.nh * s.d, nkv = size_t(s.seq) * s.nkv * s.d, nstat = size_t(s.seq) * s.nh;
  const float scale = 1.0f / std::sqrt(float(s.d));
  auto q = random(nq), k = random(nkv), v = random(nkv), dout = random(nq);
  for (auto& x : q) x *= 3.0f;
  const std::vector<int32_t> seg = packed_segments(s, rng_);
  const FlashAttentionOptions o{FlashKernel::f32, 0, 0};
  auto gq = upload(q), gk = upload(k), gv = upload(v), gseg = upload(seg, 0), gdo = upload(dout);
  auto gout = output(nq), glse = output(nstat), gdq = output(nq), gdk = output(nkv), gdv = output(nkv);
  ops::flash_attention_forward(ctx(), gq, gk, gv, gseg, gout, glse, s.batch, s.seq, s.nh, s.nkv, s.d, scale, o);
  ops::flash_attention_backward(ctx(), gq, gk, gv, gseg, gout, glse, gdo, gdq, gdk, gdv, s.batch, s.seq, s.nh, s.nkv,
                                s.d, scale, o);
  const auto dq = result(gdq, nq), dk = result(gdk, nkv), dv = result(gdv, nkv);

  std::vector<double> qd = to_double(q), kd = to_double(k), vd = to_double(v), dod = to_double(dout);
  std::vector<double> out(nq), lse(nstat);
  auto loss = [&] {
    ref::attention_forward(out.data(), lse.data(), qd.data(), kd.data(), vd.data(), seg.data(), s.batch, s.seq, s.nh,
                           s.nkv, s.d);
    double l = 0;
    for (size_t i = 0; i < nq; ++i) l += dod[i] * out[i];
    return l;
  };
  const double eps = 1e-5;
  double worst = 0;
  auto probe = [&](std::vector<double>& x, const std::vector<float>& grad, const char* what) {
    std::uniform_int_distribution<size_t> pick(0, x.size() - 1);
    for (int n = 0; n < 40; ++n) {
      const size_t i = pick(rng_);
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double lp = loss();
      x[i] = x0 - eps;
      const double lm = loss();
      x[i] = x0;
      const double fd = (lp - lm) / (2 * eps);
      const double err = std::abs(grad[i] - fd) / (1.0 + std::abs(fd));
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-4) << what << "[" << i << "]: " << grad[i] << " vs finite difference " << fd;
    }
  };
  probe(qd, dq, "dq");
  probe(kd, dk, "dk");
  probe(vd, dv, "dv");
  if (std::getenv("FORJA_REF_VERBOSE")) std::fprintf(stderr, "  finite differences: worst rel err %.3g\n", worst);
}

// Two backward runs give the same bits (no atomics; GQA's sum over heads in a fixed order), with
// and without a head split of the dk/dv kernel.
TEST_F(FlashAttentionTest, BackwardIsDeterministic) {
  const Shape s{1, 70, 6, 1, 64};
  const size_t nq = size_t(s.seq) * s.nh * s.d, nkv = size_t(s.seq) * s.nkv * s.d, nstat = size_t(s.seq) * s.nh;
  auto gq = upload(random(nq)), gk = upload(random(nkv)), gv = upload(random(nkv)), gdo = upload(random(nq));
  auto gseg = upload(std::vector<int32_t>(s.seq, 1), 0);
  auto gout = output(nq), glse = output(nstat);
  ops::flash_attention_forward(ctx(), gq, gk, gv, gseg, gout, glse, 1, s.seq, s.nh, s.nkv, s.d, 0.125f);
  std::vector<std::vector<float>> runs;
  for (int r = 0; r < 4; ++r) {
    const FlashAttentionOptions o{FlashKernel::automatic, 0, 0, r < 2 ? 1u : 6u};
    auto gdq = output(nq), gdk = output(nkv), gdv = output(nkv);
    ops::flash_attention_backward(ctx(), gq, gk, gv, gseg, gout, glse, gdo, gdq, gdk, gdv, 1, s.seq, s.nh, s.nkv,
                                  s.d, 0.125f, o);
    std::vector<float> all = result(gdq, nq);
    for (float x : result(gdk, nkv)) all.push_back(x);
    for (float x : result(gdv, nkv)) all.push_back(x);
    runs.push_back(all);
  }
  EXPECT_TRUE(runs[0] == runs[1]);
  EXPECT_TRUE(runs[2] == runs[3]);
}

TEST_F(FlashAttentionTest, AllPaddingGivesZeros) {
  const Shape s{1, 9, 2, 1, 16};
  const size_t nq = size_t(s.seq) * s.nh * s.d;
  for (FlashKernel kernel : {FlashKernel::f32, FlashKernel::automatic}) {
    SCOPED_TRACE(ops::flash_kernel_name(kernel));
    const FlashAttentionOptions o{kernel, 0, 0};
    auto gq = upload(random(nq)), gk = upload(random(nq / 2)), gv = upload(random(nq / 2));
    auto gseg = upload(std::vector<int32_t>(s.seq, 0), 0);
    auto gout = output(nq), glse = output(size_t(s.seq) * s.nh);
    auto gdq = output(nq), gdk = output(nq / 2), gdv = output(nq / 2);
    ops::flash_attention_forward(ctx(), gq, gk, gv, gseg, gout, glse, 1, s.seq, s.nh, s.nkv, s.d, 0.25f, o);
    ops::flash_attention_backward(ctx(), gq, gk, gv, gseg, gout, glse, upload(random(nq)), gdq, gdk, gdv, 1, s.seq,
                                  s.nh, s.nkv, s.d, 0.25f, o);
    for (float x : result(gout, nq)) EXPECT_EQ(x, 0.0f);
    for (float x : result(glse, size_t(s.seq) * s.nh)) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
    for (float x : result(gdq, nq)) EXPECT_EQ(x, 0.0f);
    for (float x : result(gdk, nq / 2)) EXPECT_EQ(x, 0.0f);
    for (float x : result(gdv, nq / 2)) EXPECT_EQ(x, 0.0f);
  }
}

TEST_F(FlashAttentionTest, RejectsUnsupportedShapes) {
  auto b = output(4096);
  EXPECT_TRUE(ops::flash_attention_supports(ctx(), 8));
  EXPECT_FALSE(ops::flash_attention_supports(ctx(), 0));
  EXPECT_FALSE(ops::flash_attention_supports(ctx(), 144));
  EXPECT_FALSE(ops::flash_attention_supports(ctx(), 64, {FlashKernel::coopmat_emulated, 24, 16}));
  EXPECT_TRUE(ops::flash_attention_supports(ctx(), 64, {FlashKernel::coopmat_emulated, 16, 16}));
  EXPECT_THROW(ops::flash_attention_dkdv_split(ctx(), 1, 64, 6, 1, 64, {FlashKernel::automatic, 0, 0, 4}),
               std::invalid_argument);
  EXPECT_EQ(ops::flash_attention_dkdv_split(ctx(), 1, 64, 6, 1, 64, {FlashKernel::automatic, 0, 0, 3}), 3u);
  EXPECT_THROW(ops::flash_attention_forward(ctx(), b, b, b, b, b, b, 1, 4, 3, 2, 16, 1.0f), std::invalid_argument);
  EXPECT_THROW(ops::flash_attention_forward(ctx(), b, b, b, b, b, b, 1, 4, 2, 1, 129, 1.0f), std::invalid_argument);
  EXPECT_THROW(ops::flash_attention_forward(ctx(), b, b, b, b, b, b, 8, 64, 2, 1, 16, 1.0f), std::invalid_argument);
}

}  // namespace
}  // namespace forja::test
