// Causal GQA attention, the fp32 tiled kernels (ops/attention.h) and the mixed-precision path
// through the GEMM kernels (ops/attention_gemm.h, with and without its fused forward and backward), against the double-precision reference
// (ops/ref/attention_ref.h): forward output and lse, backward dq/dk/dv, on awkward shapes (S not
// a multiple of the tiles, head_dim 6 to 128, GQA ratios 3 and 2), with plain causal masks and
// with packed segments that include padding rows. Sentinels after every output catch writes past
// the end; outputs start as NaN so a row the kernel forgets to write fails.
//
// The GEMM path rounds q, k, v and dout to fp16 where they enter a product; its reference gets
// the same rounded inputs, so what remains is the fp16 rounding of P and dS (relative 2^-11)
// and fp32 accumulation, and the tolerance can stay tight enough that a masking or chunking
// error (differences of order 1) cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>

#include "io/float16.h"
#include "ops/attention.h"
#include "ops/attention_gemm.h"
#include "ops/ref/attention_ref.h"
#include "support/expect_close.h"
#include "support/gpu_fixture.h"

namespace forja::test {
namespace {

constexpr float kSentinel = 777.25f;
constexpr uint32_t kPad = 16;

struct Shape {
  uint32_t batch, seq, nh, nkv, d;
  std::string name() const {
    return "B" + std::to_string(batch) + " S" + std::to_string(seq) + " nh" + std::to_string(nh) + " nkv" +
           std::to_string(nkv) + " d" + std::to_string(d);
  }
};

// Which implementation runs: the tiled fp32 kernels or the GEMM path with a product kernel and
// a chunk size (0 = from the default budget: one chunk for these small shapes).
struct Impl {
  bool gemm = false;
  ops::GemmKernel kernel = ops::GemmKernel::automatic;
  uint32_t chunk_rows = 0;
  bool fused_forward = false;   // the GEMM path's fused forward kernel (where the device runs it)
  bool fused_backward = false;  // and its fused backward kernels
  uint32_t emulated_row_shift = 0;  // > 0: the fused kernels' emulation, with this accumulator order
  uint32_t emulated_tile = 32;      // and this tile of keys / queries
  bool forward_prefetch = false;    // the fused forward's prefetch of the next key tile
  bool forward_pingpong = false;    // the fused forward's ping-pong schedule
  uint32_t forward_keys = 0;        // > 0: the fused forward's key tile on the device
  bool paired = false;              // the fused kernels' workgroups take two row tiles
  bool dq_from_ds = true;           // the fused backward's dq from dS through memory
  bool dq_ds_quad = false;          // and its subgroups 2 x 2
  std::string name() const {
    return gemm ? "gemm " + ops::gemm_kernel_name(kernel) + " chunk " + std::to_string(chunk_rows) +
                      (fused_forward ? " fused forward" : "") + (fused_backward ? " fused backward" : "") +
                      (emulated_row_shift ? " emulated, row shift " + std::to_string(emulated_row_shift) +
                                                ", tile " + std::to_string(emulated_tile)
                                          : "") +
                      (forward_prefetch ? ", prefetch" : "") + (forward_pingpong ? ", ping-pong" : "") +
                      (forward_keys ? ", forward keys " + std::to_string(forward_keys) : "") +
                      (paired ? ", paired" : "") +
                      (fused_backward && !dq_from_ds ? ", dq recomputed" : "") +
                      (dq_ds_quad ? ", dq from dS 2 x 2" : "")
                : "tiled";
  }
  ops::AttentionGemmOptions options() const {
    ops::AttentionGemmOptions o{kernel, chunk_rows};
    o.fused_forward = fused_forward;
    o.fused_backward = fused_backward;
    o.fused_emulated = emulated_row_shift > 0;
    if (o.fused_emulated) o.emulated_row_shift = emulated_row_shift;
    o.emulated_tile = emulated_tile;
    o.fused_forward_tiles.prefetch = forward_prefetch;
    o.fused_forward_tiles.pingpong = forward_pingpong;
    if (forward_keys) o.fused_forward_tiles.keys = forward_keys;
    o.fused_forward_tiles.paired = o.fused_backward_tiles.paired = paired;
    o.dq_from_ds = dq_from_ds;
    o.dq_ds_quad = dq_ds_quad;
    return o;
  }
};

float round_f16(float x) { return io::f16_to_float(io::float_to_f16(x)); }

std::vector<int32_t> packed_segments(const Shape& s, std::mt19937& rng);  // below, beside its tests

class AttentionTest : public GpuTest {
 protected:
  std::vector<float> random(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng_);
    return v;
  }
  template <typename T>
  gpu::Buffer upload(const std::vector<T>& v) {
    gpu::Buffer b = ctx().alloc((v.size() + kPad) * 4);
    std::vector<float> padded(v.size() + kPad, kSentinel);
    std::memcpy(padded.data(), v.data(), v.size() * 4);
    ctx().upload(b, padded);
    bufs_.push_back(b);
    return b;
  }
  gpu::Buffer output(size_t n) { return upload(std::vector<float>(n, std::nanf(""))); }
  std::vector<float> result(const gpu::Buffer& b, size_t n) {
    auto v = ctx().download<float>(b, n + kPad);
    for (uint32_t i = 0; i < kPad; ++i) EXPECT_EQ(v[n + i], kSentinel) << "write past the end at +" << i;
    v.resize(n);
    return v;
  }
  // |got - want| <= rtol (1 + |want|); -inf must match exactly.
  static void expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                           double rtol) {
    expect_close_rel(what, got, want, rtol);
  }
  void TearDown() override {
    for (auto& b : bufs_) ctx().free(b);
    GpuTest::TearDown();
  }

  // Runs forward and backward on the GPU and the reference and compares everything.
  void forward(const Impl& impl, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
               const gpu::Buffer& seg, const gpu::Buffer& out, const gpu::Buffer& lse, const Shape& s, float scale) {
    if (!impl.gemm) return ops::attention_forward(ctx(), q, k, v, seg, out, lse, s.batch, s.seq, s.nh, s.nkv, s.d, scale);
    ops::attention_gemm_forward(ctx(), q, k, v, seg, out, lse, s.batch, s.seq, s.nh, s.nkv, s.d, scale,
                                impl.options());
  }
  void backward(const Impl& impl, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                const gpu::Buffer& seg, const gpu::Buffer& out, const gpu::Buffer& lse, const gpu::Buffer& dout,
                const gpu::Buffer& dq, const gpu::Buffer& dk, const gpu::Buffer& dv, const Shape& s, float scale) {
    if (!impl.gemm)
      return ops::attention_backward(ctx(), q, k, v, seg, out, lse, dout, dq, dk, dv, s.batch, s.seq, s.nh, s.nkv,
                                     s.d, scale);
    ops::attention_gemm_backward(ctx(), q, k, v, seg, out, lse, dout, dq, dk, dv, s.batch, s.seq, s.nh, s.nkv, s.d,
                                 scale, impl.options());
  }

  void check(const Shape& s, const std::vector<int32_t>& seg, const Impl& impl = {}) {
    SCOPED_TRACE(s.name() + " " + impl.name());
    const size_t nq = size_t(s.batch) * s.seq * s.nh * s.d, nkv = size_t(s.batch) * s.seq * s.nkv * s.d;
    const size_t nstat = size_t(s.batch) * s.seq * s.nh;
    const float scale = 1.0f / std::sqrt(float(s.d));
    auto q = random(nq), k = random(nkv), v = random(nkv), dout = random(nq);
    // Larger q so the softmax is peaked, not nearly uniform (a mask error then shows clearly).
    for (auto& x : q) x *= 3.0f;

    auto gq = upload(q), gk = upload(k), gv = upload(v), gseg = upload(seg), gdo = upload(dout);
    auto gout = output(nq), glse = output(nstat), gdq = output(nq), gdk = output(nkv), gdv = output(nkv);
    forward(impl, gq, gk, gv, gseg, gout, glse, s, scale);
    backward(impl, gq, gk, gv, gseg, gout, glse, gdo, gdq, gdk, gdv, s, scale);

    if (impl.gemm)
      for (auto* x : {&q, &k, &v, &dout})
        for (float& e : *x) e = round_f16(e);
    std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
    std::vector<double> dod(dout.begin(), dout.end());
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

    // Only the GEMM path's P and dS roundings (2^-11 relative) separate it from its reference.
    const double tol_out = impl.gemm ? 2e-3 : 2e-5, tol_grad = impl.gemm ? 4e-3 : 1e-4;
    expect_close("out", result(gout, nq), out, tol_out);
    expect_close("lse", result(glse, nstat), lse_t, impl.gemm ? 1e-5 : 2e-5);
    expect_close("dq", result(gdq, nq), dq, tol_grad);
    expect_close("dk", result(gdk, nkv), dk, tol_grad);
    expect_close("dv", result(gdv, nkv), dv, tol_grad);
  }

  // The fused kernels' emulation on each (shape, accumulator order, tile) of cases, causal and
  // packed; configure(impl, index) sets what the case runs beyond the emulation itself.
  template <typename Configure>
  void check_emulated(std::span<const std::tuple<Shape, uint32_t, uint32_t>> cases, Configure configure) {
    uint32_t index = 0;
    for (const auto& [s, row_shift, tile] : cases) {
      Impl fused{true, ops::GemmKernel::automatic, 0, true};
      configure(fused, index++);
      fused.emulated_row_shift = row_shift;
      fused.emulated_tile = tile;
      check(s, std::vector<int32_t>(size_t(s.batch) * s.seq, 1), fused);
      check(s, packed_segments(s, rng_), fused);
    }
  }

  std::mt19937 rng_{7};
  std::vector<gpu::Buffer> bufs_;
};

const Shape kShapes[] = {
    {2, 1, 3, 1, 6}, {2, 7, 4, 2, 16}, {2, 33, 3, 1, 64}, {2, 65, 4, 2, 128}, {1, 65, 3, 1, 6}, {2, 17, 4, 4, 33},
};

TEST_F(AttentionTest, CausalMatchesReference) {
  for (const Shape& s : kShapes) check(s, std::vector<int32_t>(size_t(s.batch) * s.seq, 1));
}

// Packed sequences: runs of segment ids with padding (0) between and after them, a different
// pattern per sequence, so queries must ignore earlier documents and padding rows must be 0.
std::vector<int32_t> packed_segments(const Shape& s, std::mt19937& rng) {
  std::vector<int32_t> seg(size_t(s.batch) * s.seq);
  std::uniform_int_distribution<int> run_len(1, std::max<int>(2, s.seq / 3));
  for (uint32_t b = 0; b < s.batch; ++b) {
    int32_t id = 1 + int32_t(b) * 10;
    uint32_t i = 0;
    bool pad = b % 2 == 1;  // the second sequence starts with padding
    while (i < s.seq) {
      const uint32_t n = std::min<uint32_t>(run_len(rng), s.seq - i);
      for (uint32_t r = 0; r < n; ++r) seg[size_t(b) * s.seq + i + r] = pad ? 0 : id;
      if (!pad) ++id;
      pad = !pad && (rng() % 3 == 0);
      i += n;
    }
    if (s.seq > 2) seg[size_t(b) * s.seq + s.seq - 1] = 0;  // trailing padding row
  }
  return seg;
}

TEST_F(AttentionTest, PackedSegmentsWithPaddingMatchReference) {
  for (const Shape& s : kShapes) check(s, packed_segments(s, rng_));
}

// The GEMM path with the device's own product kernel and with the emulated matrix-core kernel,
// in one chunk and in several (16 rows: whole tiles; 5 rows: a ragged last chunk and key counts
// that are not multiples of 8).
const Impl kGemmImpls[] = {{true, ops::GemmKernel::automatic, 0},
                           {true, ops::GemmKernel::automatic, 5},
                           {true, ops::GemmKernel::coopmat_emulated, 16},
                           {true, ops::GemmKernel::coopmat_emulated, 0}};

TEST_F(AttentionTest, GemmPathCausalMatchesReference) {
  for (const Impl& impl : kGemmImpls)
    for (const Shape& s : kShapes) check(s, std::vector<int32_t>(size_t(s.batch) * s.seq, 1), impl);
}

TEST_F(AttentionTest, GemmPathPackedSegmentsMatchReference) {
  for (const Impl& impl : kGemmImpls)
    for (const Shape& s : kShapes) check(s, packed_segments(s, rng_), impl);
}

// The fused forward kernel (kernels/flash_forward_khr.comp), where the device runs it (NVIDIA):
// head_dim 16, 64, 128, sequences shorter than, equal to and beyond its 64-row and 64-key tiles,
// with ragged ends; causal and packed; one or two query tiles per workgroup; tiles of 64 and 32
// keys; the ping-pong schedule (modes 3 and 4); the backward (GEMM kernels) on its out and lse.
TEST_F(AttentionTest, FusedForwardMatchesReference) {
  const std::string why = ops::attention_fused_forward_unsupported(ctx(), 64);
  if (!why.empty()) GTEST_SKIP() << "no fused attention forward here: " << why;
  const Shape shapes[] = {{2, 7, 4, 2, 16},   {2, 65, 4, 2, 128}, {1, 64, 3, 1, 64}, {2, 130, 6, 1, 64},
                          {1, 200, 4, 2, 128}, {1, 256, 8, 2, 128}, {3, 33, 2, 2, 32}};
  Impl fused{true, ops::GemmKernel::automatic, 0, true};
  for (const uint32_t mode : {0, 1, 2, 3, 4}) {
    fused.paired = mode == 1 || mode == 2 || mode == 4;
    fused.forward_keys = mode == 2 || mode == 4 ? 32 : 0;
    fused.forward_pingpong = mode >= 3;
    for (const Shape& s : shapes) {
      check(s, std::vector<int32_t>(size_t(s.batch) * s.seq, 1), fused);
      check(s, packed_segments(s, rng_), fused);
    }
  }
  EXPECT_FALSE(ops::attention_fused_forward_supported(ctx(), 8));
  EXPECT_FALSE(ops::attention_fused_forward_supported(ctx(), 144));
}

// The fused backward kernels (kernels/flash_backward_khr.comp) on the fused forward's out and lse,
// where the device runs them (NVIDIA): dq in tiles of 128 query rows against 32-key tiles, dk and
// dv in tiles of 64 keys against 32-query tiles; sequences shorter than, equal to and beyond them
// with ragged ends, GQA 1 to 6; causal and packed; one or two row tiles per workgroup.
TEST_F(AttentionTest, FusedBackwardMatchesReference) {
  const std::string why = ops::attention_fused_forward_unsupported(ctx(), 64);
  if (!why.empty()) GTEST_SKIP() << "no fused attention kernels here: " << why;
  const Shape shapes[] = {{2, 7, 4, 2, 16},   {2, 65, 4, 2, 128}, {1, 64, 3, 1, 64}, {2, 130, 6, 1, 64},
                          {1, 200, 4, 2, 128}, {1, 256, 8, 2, 128}, {3, 33, 2, 2, 32}};
  Impl fused{true, ops::GemmKernel::automatic, 0, true};
  fused.fused_backward = true;
  for (const int dq : {0, 1, 2})  // from dS, from dS by subgroups 2 x 2, recomputed
    for (const bool paired : {false, true}) {
      fused.paired = paired;
      fused.dq_from_ds = dq < 2;
      fused.dq_ds_quad = dq == 1;
      for (const Shape& s : shapes) {
        check(s, std::vector<int32_t>(size_t(s.batch) * s.seq, 1), fused);
        check(s, packed_segments(s, rng_), fused);
      }
    }
}

// The fused kernels' emulation (kernels/flash_khr_common.glsl: the same kernels without
// cooperative matrices) on any device, lavapipe included: their tiling, masks, online softmax and
// the backward's recomputation from lse, forward and backward, in both accumulator orders the
// kernels know; dq recomputed (cases 0, 2, 4, 6) or from the dS the dk/dv kernel wrote (1, 3, 5:
// dS blocks of 16 and 64 queries); sequences shorter than and beyond the emulation's 16-row and 32-key tiles, head_dim
// 16 to 128, GQA 1 to 6, causal and packed; the forward with its prefetch (cases 1, 3, 5) and
// without, the row tiles one or two per workgroup (cases 1, 2, 5, 6: odd and even tile counts).
// Lavapipe compiles each (kernel, head_dim, order) for about 2 s, so few of them are asked for.
TEST_F(AttentionTest, FusedKernelsEmulatedMatchReference) {
  // (shape, accumulator order, tile): tile 64 is the real kernels' (forward keys, the backward's
  // default tiles), within lavapipe's shared memory up to head_dim 64.
  const std::tuple<Shape, uint32_t, uint32_t> cases[] = {
      {{2, 7, 4, 2, 16}, 2, 32},  {{1, 37, 2, 1, 128}, 2, 32}, {{2, 70, 6, 1, 16}, 2, 32}, {{2, 40, 6, 2, 32}, 1, 32},
      {{1, 70, 2, 2, 32}, 1, 32}, {{2, 150, 4, 1, 64}, 2, 64}, {{1, 67, 6, 2, 32}, 1, 64}};
  check_emulated(cases, [](Impl& fused, uint32_t index) {
    fused.fused_backward = true;
    fused.forward_prefetch = index % 2 == 1;
    fused.paired = index % 4 == 1 || index % 4 == 2;
    fused.dq_from_ds = index % 2 == 1;
  });
}

// The fused forward's default tiles at head_dim 128 fit NVIDIA's 48 KiB of shared memory, the
// one device kind that runs the real kernel (607bdd0 counted the emulation's exchange arrays for
// all 8 subgroups of the real kernel and refused its own defaults there); the emulation counts
// its arrays per subgroup.
TEST(AttentionFusedForwardTiles, DefaultsFitNvidiaSharedMemory) {
  const ops::AttentionGemmOptions o;
  const uint32_t warps = o.fused_forward_tiles.warps, keys = o.fused_forward_tiles.keys;
  EXPECT_LE(ops::attention_fused_forward_shared_bytes(warps, keys, 128, false), 49152u);
  EXPECT_LE(ops::attention_fused_forward_shared_bytes(warps, 32, 128, false), 49152u);
  EXPECT_GT(ops::attention_fused_forward_shared_bytes(2, 32, 128, true),
            ops::attention_fused_forward_shared_bytes(1, 32, 128, true));
}

// The same emulation with the forward's ping-pong schedule (2 subgroups, one of each role: the
// lag's softmax a step after its S, the segment ids in two slots): sequences shorter than a
// workgroup's 32 rows and beyond several key tiles, key tiles of 32 and 64, head_dim 16 to 128,
// causal and packed (tiles skipped between visible ones), one or two query tiles a workgroup.
TEST_F(AttentionTest, FusedForwardPingPongEmulatedMatchesReference) {
  const std::tuple<Shape, uint32_t, uint32_t> cases[] = {{{2, 7, 4, 2, 16}, 2, 32},
                                                         {{1, 150, 2, 1, 128}, 1, 32},
                                                         {{2, 131, 6, 2, 32}, 2, 64},
                                                         {{1, 97, 4, 2, 64}, 1, 32}};
  check_emulated(cases, [](Impl& fused, uint32_t index) {
    fused.forward_pingpong = true;
    fused.paired = index % 2 == 1;
  });
}

// The same emulation with dq from dS by subgroups 2 x 2 (AttentionGemmOptions::dq_ds_quad; the
// emulation's workgroup is 4 subgroups on 64 query rows): head_dim 32 to 128 (one to four d
// fragments a subgroup), 16 (the other layout), the dk/dv kernel's query tiles of 32 and 64
// (its dS in blocks of 32 and 64 queries), sequences shorter than and beyond a workgroup's rows,
// causal and packed, one or two row tiles a workgroup.
TEST_F(AttentionTest, FusedDqFromDsByFourSubgroupsEmulatedMatchesReference) {
  const std::tuple<Shape, uint32_t, uint32_t> cases[] = {{{1, 37, 2, 1, 128}, 2, 32},
                                                         {{2, 150, 6, 2, 32}, 1, 32},
                                                         {{2, 40, 6, 1, 16}, 2, 32},
                                                         {{1, 131, 6, 2, 64}, 1, 64}};
  check_emulated(cases, [](Impl& fused, uint32_t index) {
    fused.fused_backward = true;
    fused.dq_ds_quad = true;
    fused.paired = index % 2 == 0;
  });
}

// D = rowsum(dout * out), the fused backward's statistic (kernels/attention_row_dot.comp), on any
// device: [B*S, nh, d] rows into [B, nh, S]; with dout16, also dout rounded to fp16 in the same
// pass, bit for bit as the host rounds.
void expect_dout16(const gpu::Buffer& got16, const std::vector<float>& dout, gpu::Context& ctx) {
  const auto words = ctx.download<uint32_t>(got16, dout.size() / 2 + kPad);
  for (uint32_t i = 0; i < kPad; ++i)
    EXPECT_EQ(words[dout.size() / 2 + i], std::bit_cast<uint32_t>(kSentinel)) << "write past the end at +" << i;
  size_t wrong = 0;
  for (size_t i = 0; i < dout.size(); ++i)
    wrong += uint16_t(words[i / 2] >> (16 * (i % 2))) != io::float_to_f16(dout[i]);
  EXPECT_EQ(wrong, 0u) << "of " << dout.size() << " halves of the fp16 dout";
}

TEST_F(AttentionTest, RowDotMatchesReference) {
  const Shape shapes[] = {{2, 7, 3, 3, 16}, {1, 65, 4, 4, 128}, {3, 5, 2, 2, 6}, {1, 1, 1, 1, 2}};
  for (const Shape& s : shapes) {
    for (const bool with16 : {false, true}) {
      SCOPED_TRACE(s.name() + (with16 ? " with the fp16 dout" : ""));
      const size_t rows = size_t(s.batch) * s.seq * s.nh, n = rows * s.d;
      const auto out = random(n), dout = random(n);
      auto gout = upload(out), gdo = upload(dout), gd = output(rows), g16 = output(n / 2);
      ops::attention_row_dot(ctx(), gout, gdo, gd, s.batch, s.seq, s.nh, s.d, 0, with16 ? &g16 : nullptr);
      std::vector<double> want(rows);
      for (size_t r = 0; r < rows; ++r) {
        double sum = 0;
        for (uint32_t c = 0; c < s.d; ++c) sum += double(out[r * s.d + c]) * dout[r * s.d + c];
        const size_t token = r / s.nh, h = r % s.nh, b = token / s.seq, i = token % s.seq;
        want[(b * s.nh + h) * s.seq + i] = sum;
      }
      expect_close("drow", result(gd, rows), want, 1e-5);
      if (with16) expect_dout16(g16, dout, ctx());
    }
  }
  auto g = upload(random(200)), gd = output(100), small16 = output(2);
  EXPECT_THROW(ops::attention_row_dot(ctx(), g, g, gd, 1, 2, 1, 3), std::invalid_argument);  // odd head_dim
  EXPECT_THROW(ops::attention_row_dot(ctx(), g, g, gd, 1, 100, 1, 2, 0, &small16), std::invalid_argument);  // dout16
}

// The same with out as fp16 rows of ld halves (AttentionGemmOptions::out_f16_ld: the o_proj input
// copy the engine keeps across checkpointing), the columns past the heads holding other data.
std::vector<uint32_t> packed_halves(const std::vector<uint16_t>& h) {  // h.size() even
  std::vector<uint32_t> w(h.size() / 2);
  for (size_t i = 0; i < w.size(); ++i) w[i] = h[2 * i] | uint32_t(h[2 * i + 1]) << 16;
  return w;
}

TEST_F(AttentionTest, RowDotOfFp16RowsMatchesReference) {
  const Shape shapes[] = {{2, 7, 3, 3, 16}, {1, 65, 4, 4, 128}, {3, 5, 2, 2, 6}, {2, 1, 1, 1, 2}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(s.name());
    const size_t tokens = size_t(s.batch) * s.seq, rows = tokens * s.nh, n = rows * s.d;
    const uint32_t ld = s.nh * s.d + 6;
    const auto dout = random(n), wide = random(tokens * ld);
    std::vector<uint16_t> out16(tokens * ld);
    for (size_t i = 0; i < out16.size(); ++i) out16[i] = io::float_to_f16(wide[i]);
    auto gout = upload(packed_halves(out16)), gdo = upload(dout), gd = output(rows), g16 = output(n / 2);
    ops::attention_row_dot(ctx(), gout, gdo, gd, s.batch, s.seq, s.nh, s.d, ld, &g16);
    expect_dout16(g16, dout, ctx());
    std::vector<double> want(rows);
    for (size_t r = 0; r < rows; ++r) {
      const size_t token = r / s.nh, h = r % s.nh, b = token / s.seq, i = token % s.seq;
      double sum = 0;
      for (uint32_t c = 0; c < s.d; ++c) sum += double(io::f16_to_float(out16[token * ld + h * s.d + c])) * dout[r * s.d + c];
      want[(b * s.nh + h) * s.seq + i] = sum;
    }
    expect_close("drow", result(gd, rows), want, 1e-5);
  }
  auto small = upload(std::vector<uint32_t>(4));
  auto gdo = upload(random(8)), gd = output(4);
  EXPECT_THROW(ops::attention_row_dot(ctx(), small, gdo, gd, 1, 2, 2, 2, 3), std::invalid_argument);  // odd ld
}

TEST_F(AttentionTest, GemmPathChunkRowsFollowTheBudget) {
  ops::AttentionGemmOptions o;
  o.scratch_budget = 32ull * 1000 * 4 * 100;  // 100 rows of 32 heads x 1000 keys
  EXPECT_EQ(ops::attention_gemm_chunk_rows(ctx(), 1000, 32, o), 96u);  // whole 16-row tiles
  o.scratch_budget = 32ull * 1000 * 4 * 7;
  EXPECT_EQ(ops::attention_gemm_chunk_rows(ctx(), 1000, 32, o), 7u);
  o.scratch_budget = 1;
  EXPECT_EQ(ops::attention_gemm_chunk_rows(ctx(), 1000, 32, o), 1u);
  o.scratch_budget = 1ull << 30;
  EXPECT_EQ(ops::attention_gemm_chunk_rows(ctx(), 100, 32, o), 100u);
  o.chunk_rows = 40;
  EXPECT_EQ(ops::attention_gemm_chunk_rows(ctx(), 100, 32, o), 40u);
}

TEST_F(AttentionTest, AllPaddingGivesZeros) {
  const Shape s{1, 9, 2, 1, 8};
  const size_t nq = size_t(s.seq) * s.nh * s.d;
  for (const Impl& impl : {Impl{}, kGemmImpls[0]}) {
    SCOPED_TRACE(impl.name());
    auto gq = upload(random(nq)), gk = upload(random(nq / 2)), gv = upload(random(nq / 2));
    auto gseg = upload(std::vector<int32_t>(s.seq, 0));
    auto gout = output(nq), glse = output(size_t(s.seq) * s.nh);
    auto gdq = output(nq), gdk = output(nq / 2), gdv = output(nq / 2);
    forward(impl, gq, gk, gv, gseg, gout, glse, s, 0.35f);
    backward(impl, gq, gk, gv, gseg, gout, glse, upload(random(nq)), gdq, gdk, gdv, s, 0.35f);
    for (float x : result(gout, nq)) EXPECT_EQ(x, 0.0f);
    for (float x : result(glse, size_t(s.seq) * s.nh)) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
    for (float x : result(gdq, nq)) EXPECT_EQ(x, 0.0f);
    for (float x : result(gdk, nq / 2)) EXPECT_EQ(x, 0.0f);
    for (float x : result(gdv, nq / 2)) EXPECT_EQ(x, 0.0f);
  }
}

TEST_F(AttentionTest, RejectsBadShapes) {
  auto b = output(4096);
  EXPECT_THROW(ops::attention_forward(ctx(), b, b, b, b, b, b, 1, 4, 3, 2, 8, 1.0f), std::invalid_argument);
  EXPECT_THROW(ops::attention_forward(ctx(), b, b, b, b, b, b, 1, 4, 2, 1, 129, 1.0f), std::invalid_argument);
  EXPECT_THROW(ops::attention_forward(ctx(), b, b, b, b, b, b, 8, 64, 2, 1, 8, 1.0f), std::invalid_argument);
}

// Timing on a real GPU (not a test: run with --gtest_also_run_disabled_tests). Qwen3-8B-like
// attention: 32 query heads, 8 kv heads, d 128, one sequence of 4096 tokens.
TEST_F(AttentionTest, DISABLED_BenchQwen3Shape) {
  const Shape s{1, 4096, 32, 8, 128};
  const size_t nq = size_t(s.seq) * s.nh * s.d, nkv = size_t(s.seq) * s.nkv * s.d, nstat = size_t(s.seq) * s.nh;
  auto gq = upload(random(nq)), gk = upload(random(nkv)), gv = upload(random(nkv)), gdo = upload(random(nq));
  auto gseg = upload(std::vector<int32_t>(s.seq, 1));
  auto gout = output(nq), glse = output(nstat), gdq = output(nq), gdk = output(nkv), gdv = output(nkv);
  const float scale = 1.0f / std::sqrt(float(s.d));
  const double causal_flops = 2.0 * s.nh * (0.5 * s.seq * (s.seq + 1.0)) * s.d;
  for (const Impl& impl : {Impl{}, kGemmImpls[0]})
    for (int pass = 0; pass < 3; ++pass) {
      auto t0 = std::chrono::steady_clock::now();
      forward(impl, gq, gk, gv, gseg, gout, glse, s, scale);
      ctx().finish();
      auto t1 = std::chrono::steady_clock::now();
      backward(impl, gq, gk, gv, gseg, gout, glse, gdo, gdq, gdk, gdv, s, scale);
      ctx().finish();
      auto t2 = std::chrono::steady_clock::now();
      const double f = std::chrono::duration<double>(t1 - t0).count(),
                   b = std::chrono::duration<double>(t2 - t1).count();
      std::fprintf(stderr, "attention %s %s: forward %.2f ms (%.1f TFLOP/s), backward %.2f ms (%.1f TFLOP/s)\n",
                   impl.name().c_str(), s.name().c_str(), f * 1e3, 2 * causal_flops / f * 1e-12, b * 1e3,
                   5 * causal_flops / b * 1e-12);
    }
}

}  // namespace
}  // namespace forja::test
