#include "ops/gemm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/kernel_table.h"
#include "ops/elementwise.h"
#include "util/error.h"

namespace forja::ops {

namespace {

// Must match GemmPush in kernels/gemm_common.glsl.
struct GemmPush {
  uint32_t m, n, k;
  uint32_t lda, ldb, ldc;
  uint32_t a_offset, b_offset, c_offset;
  uint32_t a_stride, b_stride, c_stride;
  float alpha, beta;
};
static_assert(kernels::push_block_matches<GemmPush>(
                  kernels::gemm_f32_t64, kernels::gemm_f32_t128, kernels::gemm_f16_t64, kernels::gemm_f16_t128,
                  kernels::gemm_f32f16_t64, kernels::gemm_f32f16_t128, kernels::gemm_cm2, kernels::gemm_cm2_edge,
                  kernels::gemm_cm2_af32, kernels::gemm_cm2_af32_edge, kernels::gemm_nvcm, kernels::gemm_nvcm_emu,
                  kernels::gemm_nvcm_af32, kernels::gemm_nvcm_af32_emu, kernels::gemm_khr, kernels::gemm_khr_af32),
              "GemmPush differs from kernels/gemm_common.glsl's push-constant block");

// The scalar kernel for the operand types (mixed: fp32 A, fp16 B) and a tile of `bm` rows.
const kernels::Kernel& scalar_kernel(bool mixed, DType a, uint32_t bm) {
  const bool wide = bm == 128;
  if (!wide && bm != 64) throw std::logic_error("gemm: no scalar kernel for a tile of " + std::to_string(bm) + " rows");
  if (mixed) return wide ? kernels::gemm_f32f16_t128 : kernels::gemm_f32f16_t64;
  if (a == DType::f16) return wide ? kernels::gemm_f16_t128 : kernels::gemm_f16_t64;
  return wide ? kernels::gemm_f32_t128 : kernels::gemm_f32_t64;
}

struct ScalarTile {
  uint32_t bm, bn, bk, tm, tn;
};
struct CoopTile {
  uint32_t bm, bn, bk, wm, wn, stages;
};

// Elements of a stored matrix that a product touches, from its first element: the last row
// starts at (rows-1)*ld and holds `cols` elements; batches add (batch-1)*stride.
uint64_t span_elements(uint64_t rows, uint64_t cols, uint64_t ld, uint32_t batch, uint64_t stride) {
  if (rows == 0 || cols == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

struct Operand {
  gpu::Buffer binding;
  uint32_t offset;  // elements from the binding's start
};

// A binding that covers `span` elements from element `offset` of `m`, starting at an offset
// the device accepts; the remainder of the offset goes to the kernel.
Operand bind(const gpu::Context& ctx, const MatrixView& m, uint64_t offset, uint64_t span) {
  const uint64_t es = dtype_bytes(m.dtype);
  const uint64_t align = std::max<uint64_t>(16, ctx.info().min_storage_offset_alignment);
  const uint64_t first = offset * es;
  const uint64_t begin = first / align * align;
  uint64_t end = std::min<uint64_t>((first + span * es + 15) / 16 * 16, m.buffer.size);
  if (first + span * es > m.buffer.size)
    throw std::logic_error("gemm: operand view of " + std::to_string(m.buffer.size) +
                           " bytes is too small for the product");
  if (end <= begin) end = std::min<uint64_t>(begin + 16, m.buffer.size);
  return {m.buffer.slice(begin, end - begin), static_cast<uint32_t>((first - begin) / es)};
}

bool coopmat_available(const gpu::Context& ctx) {
  return ctx.info().nv_coopmat_f16_f32_16x16x16 && kernels::gemm_nvcm.built;
}
bool khr_available(const gpu::Context& ctx) {
  return ctx.info().khr_fragment.m != 0 && kernels::gemm_khr.built;
}

// NV2 tiles: {BM, BN, BK, workgroup size, K tiles per loop body, GROUP_M}. Measured on an H100
// at the training step's shapes (M = 16384, bench/cm2_tile_sweep.sh, docs/benchmarks.md):
// 128x128x64 on 128 invocations (four subgroups of 64x64) runs at 245-314 TFLOP/s on every
// Qwen3-4B product, forward (NT) and backward (NN), where the H200 probe's 128x256x64 on 256
// (../shared/tools/cm2probe) gave 196-268 and 128x128x64 on 256 218-233. 64x64x64 on 128 is
// for products too small to give every compute unit half a 128x128 tile.
struct Cm2Tile {
  uint32_t bm, bn, bk, threads, unroll, group_m;
};
const Cm2Tile kCm2Square{128, 128, 64, 128, 4, 8}, kCm2Small{64, 64, 64, 128, 4, 8};

// Whether the device lists an fp16 x fp16 + fp32 workgroup-scope shape for this tile.
bool cm2_tile_supported(const gpu::DeviceInfo& info, const Cm2Tile& t) {
  if (t.threads > info.nv_coopmat2_max_workgroup || std::max({t.bm, t.bn, t.bk}) > info.nv_coopmat2_max_dimension)
    return false;
  for (const gpu::CoopMatShape& e : info.nv_coopmat2_workgroup_shapes)
    if (e.workgroup_invocations == t.threads && e.a_type == "f16" && e.b_type == "f16" && e.c_type == "f32" &&
        e.result_type == "f32" && t.bm % e.m == 0 && t.bn % e.n == 0 && t.bk % e.k == 0)
      return true;
  return false;
}
bool cm2_available(const gpu::Context& ctx) {
  const gpu::DeviceInfo& info = ctx.info();
  return info.nv_coopmat2 && kernels::gemm_cm2.built && cm2_tile_supported(info, kCm2Square) &&
         cm2_tile_supported(info, kCm2Small);
}

// FORJA_CM2_TILE=BMxBNxBK/threads/unroll/group_m (e.g. 128x256x64/256/8/1): every NV2 product
// uses that tile, for measuring tiles against each other (bench/cm2_tile_sweep.sh); products
// whose sizes are not multiples of the tile take the bounds-checked variant as usual.
std::optional<Cm2Tile> cm2_tile_override(const gpu::DeviceInfo& info) {
  const char* v = std::getenv("FORJA_CM2_TILE");
  if (!v || !*v) return std::nullopt;
  Cm2Tile t{};
  char end = 0;
  if (std::sscanf(v, "%ux%ux%u/%u/%u/%u%c", &t.bm, &t.bn, &t.bk, &t.threads, &t.unroll, &t.group_m, &end) != 6 ||
      !t.bm || !t.bn || !t.bk || !t.unroll || !t.group_m)
    throw UserError(std::string("FORJA_CM2_TILE=") + v +
                    " is not BMxBNxBK/threads/unroll/group_m (e.g. 128x128x64/128/4/8)");
  if (!cm2_tile_supported(info, t))
    throw UserError(std::string("FORJA_CM2_TILE=") + v +
                    ": the device lists no fp16 workgroup-scope shape for this tile");
  return t;
}

Cm2Tile cm2_tile(const GemmShape& s, const gpu::DeviceInfo& info) {
  static const std::optional<Cm2Tile> forced = cm2_tile_override(info);
  if (forced) return *forced;
  const uint32_t cu = info.compute_units ? info.compute_units : 64;
  auto groups = [&](const Cm2Tile& t) { return uint64_t((s.m + t.bm - 1) / t.bm) * ((s.n + t.bn - 1) / t.bn) * s.batch; };
  if (groups(kCm2Square) * 2 >= cu) return kCm2Square;
  return kCm2Small;
}

// The family automatic may use at most (FORJA_GEMM_FAMILY / FORJA_NO_COOPMAT), best first.
GemmKernel family_cap() {
  if (gpu::env_flag("FORJA_NO_COOPMAT")) return GemmKernel::scalar;
  const char* f = std::getenv("FORJA_GEMM_FAMILY");
  if (!f || !*f) return GemmKernel::nv_coopmat2;
  const std::string v = f;
  if (v == "nv-coopmat2") return GemmKernel::nv_coopmat2;
  if (v == "khr-coopmat") return GemmKernel::khr_coopmat;
  if (v == "coopmat") return GemmKernel::coopmat;
  if (v == "scalar") return GemmKernel::scalar;
  throw UserError("FORJA_GEMM_FAMILY=" + v + " is not a GEMM family; use nv-coopmat2, khr-coopmat, coopmat or scalar");
}

bool is_scalar(GemmKernel k) {
  return k == GemmKernel::scalar || k == GemmKernel::scalar_t64 || k == GemmKernel::scalar_t128;
}

const ScalarTile kScalarT64{64, 64, 16, 4, 4}, kScalarT128{128, 128, 8, 8, 8};

ScalarTile scalar_tile(const gpu::Context& ctx, const GemmShape& s, GemmKernel kernel) {
  if (kernel == GemmKernel::scalar_t64) return kScalarT64;
  if (kernel == GemmKernel::scalar_t128) return kScalarT128;
  if (s.m < 128 || s.n < 128) return kScalarT64;
  // The 128x128 tile does twice the FMAs per shared-memory load of the 64x64 one and half the
  // global-memory traffic per FMA, but on a GPU it only pays when there are enough workgroups
  // to keep every compute unit busy: with fewer, part of the device idles (wave quantisation). 128 workgroups fill the largest GPUs
  // (H200: 132 SMs) at least once; smaller products take the 64x64 tile (4x the workgroups).
  // A CPU driver runs a few workgroups at a time and gains from the larger tile regardless
  // (lavapipe: twice as fast at 512^3).
  const uint64_t groups128 = uint64_t((s.m + 127) / 128) * ((s.n + 127) / 128) * s.batch;
  if (!ctx.info().is_cpu() && groups128 < 128) return kScalarT64;
  return kScalarT128;
}

CoopTile coop_tile(const GemmShape& s, bool emulated, uint32_t compute_units) {
  // Largest tile that still gives the device enough workgroups to fill it, skipping tiles at
  // least twice as tall (wide) as the product, which would leave half of their rows (columns)
  // idle: attention's chunks of 128 query rows, head_dim 128 wide.
  static const CoopTile candidates[] = {
      {256, 128, 32, 4, 2, 1}, {128, 256, 32, 2, 4, 1}, {128, 128, 32, 2, 2, 2}, {64, 64, 32, 2, 2, 2}};
  const CoopTile& smallest = candidates[3];
  if (emulated) return smallest;
  const uint64_t want_groups = 120;
  for (const CoopTile& t : candidates) {
    if (&t == &smallest) return t;
    if (2 * s.m <= t.bm || 2 * s.n <= t.bn) continue;
    const uint64_t groups = uint64_t((s.m + t.bm - 1) / t.bm) * ((s.n + t.bn - 1) / t.bn) * s.batch;
    if (groups < want_groups) continue;
    if (compute_units > 0) {
      // Wave quantisation: the larger tiles run about one workgroup per compute unit at a time,
      // so groups = 1.2 waves takes as long as 2 full ones. On an H200 (132 SMs) the 2048 x 2560
      // outputs (o_proj, down_proj, input gradients of Qwen3-4B) ran at 100-111 TFLOP/s with
      // 256x128 (160 groups, 61% of the last two waves busy) or 128x128 (320, 81%) and at
      // 113-130 with 64x64; outputs that fill their waves (2048 x 4096: 256 groups, 97%) run at
      // 155-165 with 256x128 against 115-130 with 64x64 (docs/benchmarks.md).
      const uint64_t waves = (groups + compute_units - 1) / compute_units;
      if (groups * 100 < waves * compute_units * 85) continue;
    }
    return t;
  }
  return smallest;
}

uint32_t coop_shared_bytes(const CoopTile& t, bool ta, bool tb, const gpu::KhrFragment& f) {
  uint32_t ra = ta ? t.bk : t.bm, ca = (ta ? t.bm : t.bk) / 8;
  uint32_t rb = tb ? t.bn : t.bk, cb = (tb ? t.bk : t.bn) / 8;
  return t.stages * (ra * (ca + 1) + rb * (cb + 1)) * 16 + t.wm * t.wn * f.m * f.n * 4;
}

// NV v1's fragment: 16x16x16 at subgroup 32.
constexpr gpu::KhrFragment kNvFragment{16, 16, 16, 32};

void dispatch_part(gpu::Context& ctx, const GemmShape& s, const MatrixView& a, uint64_t a_off, const MatrixView& b,
                   uint64_t b_off, const MatrixView& c, uint64_t c_off, GemmKernel kernel,
                   const gpu::KhrFragment& frag) {
  if (s.m == 0 || s.n == 0) return;
  const uint64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  const uint64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  const uint64_t a_span = span_elements(a_rows, a_cols, a.ld, s.batch, s.a_stride);
  const uint64_t b_span = span_elements(b_rows, b_cols, b.ld, s.batch, s.b_stride);
  const uint64_t c_span = span_elements(s.m, s.n, c.ld, s.batch, s.c_stride);
  const uint64_t range = ctx.info().max_storage_buffer_range - 256;  // room for alignment slack
  const bool a_big = a_span * dtype_bytes(a.dtype) > range, b_big = b_span * dtype_bytes(b.dtype) > range;
  const bool c_big = c_span * 4 > range;
  if (a_big || b_big || c_big) {
    // Halve the dimension that shrinks the oversized operand; batches first.
    if (s.batch > 1) {
      GemmShape h = s;
      h.batch = s.batch / 2;
      dispatch_part(ctx, h, a, a_off, b, b_off, c, c_off, kernel, frag);
      GemmShape r = s;
      r.batch = s.batch - h.batch;
      dispatch_part(ctx, r, a, a_off + h.batch * s.a_stride, b, b_off + h.batch * s.b_stride, c,
                    c_off + h.batch * s.c_stride, kernel, frag);
      return;
    }
    const bool split_m = (a_big || (c_big && s.m >= s.n)) && s.m > 1;
    if (!split_m && s.n <= 1) throw std::logic_error("gemm: a single row exceeds maxStorageBufferRange");
    GemmShape h = s, r = s;
    if (split_m) {
      h.m = s.m / 2;
      r.m = s.m - h.m;
      dispatch_part(ctx, h, a, a_off, b, b_off, c, c_off, kernel, frag);
      const uint64_t a_step = s.trans_a ? h.m : uint64_t(h.m) * a.ld;
      dispatch_part(ctx, r, a, a_off + a_step, b, b_off, c, c_off + uint64_t(h.m) * c.ld, kernel, frag);
    } else {
      h.n = s.n / 2;
      r.n = s.n - h.n;
      dispatch_part(ctx, h, a, a_off, b, b_off, c, c_off, kernel, frag);
      const uint64_t b_step = s.trans_b ? uint64_t(h.n) * b.ld : h.n;
      dispatch_part(ctx, r, a, a_off, b, b_off + b_step, c, c_off + h.n, kernel, frag);
    }
    return;
  }

  const Operand oa = bind(ctx, a, a_off, std::max<uint64_t>(a_span, 1));
  const Operand ob = bind(ctx, b, b_off, std::max<uint64_t>(b_span, 1));
  const Operand oc = bind(ctx, c, c_off, c_span);
  GemmPush push{s.m,       s.n,       s.k,       a.ld,
                b.ld,      c.ld,      oa.offset, ob.offset,
                oc.offset, static_cast<uint32_t>(s.a_stride), static_cast<uint32_t>(s.b_stride),
                static_cast<uint32_t>(s.c_stride), s.alpha, s.beta};
  const double flops = 2.0 * s.m * s.n * s.k * s.batch;
  // The profile's name: the product's, or the kernel's; with FORJA_PROFILE=shapes its shape too.
  std::string shaped;
  auto op_name = [&](const char* kernel_name) -> const char* {
    const char* name = s.op ? s.op : kernel_name;
    if (!ctx.profiling_shapes()) return name;
    shaped = std::string(name) + " " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
             (s.batch > 1 ? "x" + std::to_string(s.batch) : std::string()) + (s.trans_a ? " T" : " N") +
             (s.trans_b ? "T" : "N");
    return shaped.c_str();
  };
  std::vector<gpu::Binding> bindings = {{oa.binding, gpu::Access::read},
                                        {ob.binding, gpu::Access::read},
                                        {oc.binding, s.beta != 0.0f ? gpu::Access::read_write : gpu::Access::write}};

  const bool mixed = a.dtype == DType::f32 && b.dtype == DType::f16;
  if (is_scalar(kernel)) {
    const ScalarTile t = scalar_tile(ctx, s, kernel);
    // 4-element chunks (vec4 loads and stores) need every chunk of the stored rows to be aligned
    // and wholly inside or wholly outside the matrix (see gemm.comp).
    const uint64_t a_contig = s.trans_a ? s.m : s.k, b_contig = s.trans_b ? s.k : s.n;
    auto chunks_ok = [&](uint64_t ld, uint64_t offset, uint64_t stride, uint64_t contig) {
      return ld % 4 == 0 && offset % 4 == 0 && (s.batch == 1 || stride % 4 == 0) && contig % 4 == 0;
    };
    const bool vec_a = chunks_ok(a.ld, oa.offset, s.a_stride, a_contig);
    const bool vec_b = chunks_ok(b.ld, ob.offset, s.b_stride, b_contig);
    const bool vec_c = chunks_ok(c.ld, oc.offset, s.c_stride, s.n);
    const char* base = mixed ? "gemm_f32f16" : a.dtype == DType::f16 ? "gemm_f16" : "gemm_f32";
    const auto& p = ctx.pipelines().get(scalar_kernel(mixed, a.dtype, t.bm), {s.trans_a, s.trans_b, vec_a, vec_b, vec_c});
    ctx.dispatch(p, bindings, push, (s.n + t.bn - 1) / t.bn, (s.m + t.bm - 1) / t.bm, s.batch, op_name(base),
                 flops);
    return;
  }
  if (kernel == GemmKernel::nv_coopmat2) {
    const Cm2Tile t = cm2_tile(s, ctx.info());
    const bool exact = s.m % t.bm == 0 && s.n % t.bn == 0 && s.k % t.bk == 0;
    const bool aligned = a.ld % 8 == 0 && b.ld % 8 == 0 && c.ld % 8 == 0;
    const kernels::Kernel& k = mixed ? (exact ? kernels::gemm_cm2_af32 : kernels::gemm_cm2_af32_edge)
                                     : (exact ? kernels::gemm_cm2 : kernels::gemm_cm2_edge);
    const auto& p = ctx.pipelines().get(k, {t.threads, t.bm, t.bn, t.bk, t.unroll, t.group_m, s.trans_a, s.trans_b, aligned});
    ctx.dispatch(p, bindings, push, (s.n + t.bn - 1) / t.bn, (s.m + t.bm - 1) / t.bm, s.batch, op_name(k.name),
                 flops);
    return;
  }
  // The subgroup-scope kernel: NV v1, KHR, or either emulated.
  const bool emulated = kernel == GemmKernel::coopmat_emulated;
  const bool khr = kernel == GemmKernel::khr_coopmat;
  CoopTile t = coop_tile(s, emulated, ctx.info().compute_units);
  if (t.bk % frag.k) t.bk = frag.k;
  // Within the device's shared memory: the smallest tile, then one stage (large fragments'
  // epilogue scratch on 32 KiB devices).
  const uint32_t max_shared = ctx.info().max_shared_memory;
  if (coop_shared_bytes(t, s.trans_a, s.trans_b, frag) > max_shared) t = {64, 64, std::max(32u, frag.k), 2, 2, 2};
  if (coop_shared_bytes(t, s.trans_a, s.trans_b, frag) > max_shared) t.stages = 1;
  if (coop_shared_bytes(t, s.trans_a, s.trans_b, frag) > max_shared)
    throw std::logic_error("gemm: the cooperative-matrix tile does not fit the device's shared memory");
  // Vector loads need every 8-half chunk of the stored rows to be aligned and whole.
  const uint64_t a_contig = s.trans_a ? s.m : s.k, b_contig = s.trans_b ? s.k : s.n;
  const bool vec_a = a.ld % 8 == 0 && oa.offset % 8 == 0 && s.a_stride % 8 == 0 && a_contig % 8 == 0;
  const bool vec_b = b.ld % 8 == 0 && ob.offset % 8 == 0 && s.b_stride % 8 == 0 && b_contig % 8 == 0;
  const uint32_t threads = t.wm * t.wn * frag.subgroup_size;
  const kernels::Kernel& k = khr        ? (mixed ? kernels::gemm_khr_af32 : kernels::gemm_khr)
                             : emulated ? (mixed ? kernels::gemm_nvcm_af32_emu : kernels::gemm_nvcm_emu)
                                        : (mixed ? kernels::gemm_nvcm_af32 : kernels::gemm_nvcm);
  const auto& p = ctx.pipelines().get(k, {threads, t.bm, t.bn, t.bk, t.wm, t.wn, t.stages, s.trans_a, s.trans_b, vec_a,
                                       vec_b, frag.subgroup_size, frag.m, frag.n, frag.k},
                                      khr ? frag.subgroup_size : 0);
  ctx.dispatch(p, bindings, push, (s.n + t.bn - 1) / t.bn, (s.m + t.bm - 1) / t.bm, s.batch, op_name(k.name),
               flops);
}

// GemmF16Copy's contract, for both ways of writing the copies (the summing kernel's pairs of
// halves, to_f16_block's): at most two, N and every copy's offset, ld and width even, N <= width <= ld.
void check_f16_copies(std::span<const GemmF16Copy> copies, uint32_t n) {
  if (copies.empty()) return;
  if (copies.size() > 2 || n % 2) throw std::logic_error("gemm: one or two fp16 copies of C, of an even N");
  for (const GemmF16Copy& d : copies)
    if (d.offset % 2 || d.ld % 2 || d.width % 2 || d.width < n || d.ld < d.width)
      throw std::logic_error("gemm: an fp16 copy of C needs even offset, ld and width, N <= width <= ld");
}

// Splits K into `slices` (s.split_k > 1 already resolved): the partial products go to a
// scratch [slices, M, N] as one strided batch (plus one product for a shorter last slice),
// then gemm_split_k sums them into C with beta.
void gemm_split_k(gpu::Context& ctx, const GemmShape& s, uint32_t slices, const MatrixView& a, const MatrixView& b,
                  const MatrixView& c, GemmKernel kernel, const gpu::KhrFragment& frag,
                  std::span<const GemmF16Copy> copies) {
  const uint32_t ks = (s.k + slices - 1) / slices;
  // Whole K tiles per slice (NV2's: its exact variant needs K a multiple of 64).
  const uint32_t tile_k = kernel == GemmKernel::nv_coopmat2 ? 64 : 16;
  const uint32_t step = (ks + tile_k - 1) / tile_k * tile_k;
  const uint32_t full = s.k / step, rest = s.k - full * step;
  const uint32_t parts = full + (rest > 0 ? 1 : 0);
  const uint64_t mn = uint64_t(s.m) * s.n;
  gpu::Buffer scratch = ctx.alloc(parts * mn * 4, "gemm split-K partial products");
  // Slice j of A is its columns (rows when transposed) [j*step, (j+1)*step); likewise B's rows.
  const uint64_t a_step = s.trans_a ? uint64_t(step) * a.ld : step;
  const uint64_t b_step = s.trans_b ? step : uint64_t(step) * b.ld;
  GemmShape p = s;
  p.k = step, p.beta = 0.0f, p.batch = full, p.a_stride = a_step, p.b_stride = b_step, p.c_stride = mn,
  p.split_k = 1;
  const MatrixView part{scratch, DType::f32, 0, s.n};
  if (full > 0) dispatch_part(ctx, p, a, a.offset, b, b.offset, part, 0, kernel, frag);
  if (rest > 0) {
    p.k = rest, p.batch = 1;
    dispatch_part(ctx, p, a, a.offset + full * a_step, b, b.offset + full * b_step, part, full * mn, kernel, frag);
  }
  gemm_sum_slices(ctx, scratch, parts, s.m, s.n, c, s.beta, "gemm_split_k", copies);
  ctx.free(scratch);
}

}  // namespace

void gemm_sum_slices(gpu::Context& ctx, const gpu::Buffer& parts, uint32_t slices, uint32_t m, uint32_t n,
                     const MatrixView& c, float beta, const char* op, std::span<const GemmF16Copy> copies) {
  struct ReducePush {
    uint32_t m, n, ldc, c_offset, slices;
    float beta;
  };
  struct ReduceF16Push {
    uint32_t m, n, ldc, c_offset, slices;
    float beta;
    uint32_t copies, d0_offset, d0_ld, d0_width, d1_offset, d1_ld, d1_width;
  };
  static_assert(kernels::push_block_matches<ReducePush>(kernels::gemm_split_k));
  static_assert(kernels::push_block_matches<ReduceF16Push>(kernels::gemm_split_k_f16));
  if (c.dtype != DType::f32 || c.ld < n) throw std::logic_error("gemm_sum_slices: C must be fp32 with ld >= n");
  const uint64_t mn = uint64_t(m) * n;
  if (parts.size < slices * mn * 4) throw std::logic_error("gemm_sum_slices: the parts buffer is smaller than its slices");
  const Operand oc = bind(ctx, c, c.offset, span_elements(m, n, c.ld, 1, 0));
  const uint32_t groups = static_cast<uint32_t>(std::min<uint64_t>((mn + 255) / 256, 65535));
  const gpu::Binding partial{parts.slice(0, slices * mn * 4), gpu::Access::read};
  const gpu::Binding out{oc.binding, beta != 0.0f ? gpu::Access::read_write : gpu::Access::write};
  if (copies.empty()) {
    const ReducePush push{m, n, c.ld, static_cast<uint32_t>(oc.offset), slices, beta};
    ctx.dispatch(ctx.pipelines().get(kernels::gemm_split_k), {partial, out}, push, groups, 1, 1, op);
    return;
  }
  check_f16_copies(copies, n);
  Operand od[2];
  for (size_t i = 0; i < copies.size(); ++i) {
    const GemmF16Copy& d = copies[i];
    od[i] = bind(ctx, MatrixView{d.buffer, DType::f16, d.offset, d.ld}, d.offset, span_elements(m, d.width, d.ld, 1, 0));
  }
  const GemmF16Copy& d0 = copies[0];
  const GemmF16Copy& d1 = copies.size() > 1 ? copies[1] : copies[0];
  const Operand& o1 = copies.size() > 1 ? od[1] : od[0];
  const ReduceF16Push push{m, n, c.ld, static_cast<uint32_t>(oc.offset), slices, beta,
                           static_cast<uint32_t>(copies.size()), od[0].offset, d0.ld, d0.width, o1.offset, d1.ld,
                           d1.width};
  ctx.dispatch(ctx.pipelines().get(kernels::gemm_split_k_f16),
               {partial, out, {od[0].binding, gpu::Access::write}, {o1.binding, gpu::Access::write}}, push, groups, 1,
               1, op);
}

CoopTileSize gemm_coop_tile_size(const GemmShape& shape, uint32_t compute_units) {
  const CoopTile t = coop_tile(shape, false, compute_units);
  return {t.bm, t.bn};
}

namespace {
// A workgroup count from environment variable `name` (measuring knobs, read by their callers
// once): nullopt when unset or empty; a UserError unless it is a number in [min, 2^20].
std::optional<uint64_t> env_workgroups(const char* name, uint64_t min) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const unsigned long n = std::strtoul(v, &end, 10);
  if (*end || n < min || n > (1u << 20))
    throw UserError(std::string(name) + "=" + v + " is not a workgroup count (" + std::to_string(min) +
                    " to 1048576)");
  return uint64_t{n};
}

// The workgroups a thin product's split aims for (gemm_split_k_slices); FORJA_SPLIT_K_THIN
// overrides it, for measuring (read once).
uint64_t thin_split_target() {
  static const uint64_t target = env_workgroups("FORJA_SPLIT_K_THIN", 1).value_or(1024);
  return target;
}

// NV2 products split along K only where K is long and the output tiles fill less than three
// waves of one workgroup per compute unit: at M 2048 (1x2048, 4x512) down_proj's forward and the
// gate/up backward's dx (N 2560, K 9792, 320 tiles) ran at 242 / 228 TFLOP/s whole and 267 / 251
// in two slices on an H100, while splitting shorter products lost (k/v's 203 -> 128;
// docs/benchmarks.md). FORJA_SPLIT_K_NV2=N instead splits every product with fewer than N tiles
// towards N workgroups (slices of at least 512), for measuring; 0: never.
constexpr uint32_t kNv2SplitMinK = 8192;
std::optional<uint64_t> nv2_split_override() {
  static const std::optional<uint64_t> target = env_workgroups("FORJA_SPLIT_K_NV2", 0);
  return target;
}
uint32_t nv2_split_k_slices(const GemmShape& s, const gpu::DeviceInfo& info) {
  if (s.batch != 1 || s.split_k == 1) return 1;
  const Cm2Tile t = cm2_tile(s, info);
  const uint64_t tiles = uint64_t((s.m + t.bm - 1) / t.bm) * ((s.n + t.bn - 1) / t.bn);
  constexpr uint64_t kMinSlice = 512, kMaxScratch = 96ull << 20;
  uint64_t slices = 1;
  if (const std::optional<uint64_t> target = nv2_split_override()) {
    if (*target > tiles && s.k >= 2 * kMinSlice) slices = std::min<uint64_t>((*target + tiles - 1) / tiles, s.k / kMinSlice);
  } else {
    const uint32_t cu = info.compute_units ? info.compute_units : 64;
    if (s.k >= kNv2SplitMinK && tiles < 3ull * cu) slices = 2;
  }
  slices = std::min<uint64_t>(slices, kMaxScratch / (uint64_t(s.m) * s.n * 4));
  return static_cast<uint32_t>(std::max<uint64_t>(slices, 1));
}
}  // namespace

uint32_t gemm_split_k_slices(const GemmShape& s) {
  if (s.batch != 1) return 1;  // batches are split across workgroups already
  if (s.split_k != 0) return s.split_k;
  // Output tiles at the smallest tile (64 x 64); aim for about 256 workgroups in all, every
  // slice at least 256 long, and a scratch of at most 32 MiB. Thin products (one tile row or
  // column: LoRA's rank-r sides) aim for 1024 and split below 512 tiles: with 256 the largest
  // of them ran at 11-20 TFLOP/s on an H100's 132 SMs (dB of gate_proj at 8x2048: 152 tiles
  // that each walked 16384 tokens; docs/benchmarks.md).
  constexpr uint64_t kMinSlice = 256, kMaxScratch = 32ull << 20;
  const bool thin = std::min(s.m, s.n) <= 64;
  const uint64_t target = thin ? thin_split_target() : 256;
  const uint64_t tiles = uint64_t((s.m + 63) / 64) * ((s.n + 63) / 64);
  if ((thin ? tiles * 2 >= target : tiles * 4 >= target) || s.k < 2 * kMinSlice) return 1;
  uint64_t slices = std::min<uint64_t>((target + tiles - 1) / tiles, s.k / kMinSlice);
  slices = std::min<uint64_t>(slices, kMaxScratch / (uint64_t(s.m) * s.n * 4));
  return static_cast<uint32_t>(std::max<uint64_t>(slices, 1));
}

bool gemm_kernel_available(const gpu::Context& ctx, GemmKernel k) {
  switch (k) {
    case GemmKernel::coopmat: return coopmat_available(ctx);
    case GemmKernel::khr_coopmat: return khr_available(ctx);
    case GemmKernel::nv_coopmat2: return cm2_available(ctx);
    default: return true;
  }
}

GemmKernel gemm_kernel_for(const gpu::Context& ctx, DType operands) {
  if (operands != DType::f16) return GemmKernel::scalar;
  const GemmKernel cap = family_cap();
  // Best first; the cap skips the families above it.
  static const GemmKernel order[] = {GemmKernel::nv_coopmat2, GemmKernel::khr_coopmat, GemmKernel::coopmat};
  bool allowed = false;
  for (GemmKernel k : order) {
    allowed = allowed || k == cap;
    if (allowed && gemm_kernel_available(ctx, k)) return k;
  }
  return GemmKernel::scalar;
}

std::string gemm_kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::automatic: return "automatic";
    case GemmKernel::scalar: return "scalar";
    case GemmKernel::scalar_t64: return "scalar-t64";
    case GemmKernel::scalar_t128: return "scalar-t128";
    case GemmKernel::coopmat: return "coopmat";
    case GemmKernel::coopmat_emulated: return "coopmat-emulated";
    case GemmKernel::khr_coopmat: return "khr-coopmat";
    case GemmKernel::nv_coopmat2: return "nv-coopmat2";
  }
  return "?";
}

namespace {

void run_gemm(gpu::Context& ctx, const GemmShape& s, const MatrixView& a, const MatrixView& b, const MatrixView& c,
              GemmKernel kernel, gpu::KhrFragment frag, std::span<const GemmF16Copy> copies = {}) {
  if (!copies.empty() && s.batch != 1) throw std::logic_error("gemm: fp16 copies of C are for single products");
  check_f16_copies(copies, s.n);
  if (a.dtype != b.dtype && !(a.dtype == DType::f32 && b.dtype == DType::f16))
    throw std::logic_error("gemm: A and B must have the same dtype, or A fp32 and B fp16");
  if (c.dtype != DType::f32) throw std::logic_error("gemm: C must be fp32");
  if (s.batch == 0) return;
  const uint64_t a_cols = s.trans_a ? s.m : s.k, b_cols = s.trans_b ? s.k : s.n;
  if (a.ld < a_cols || b.ld < b_cols || c.ld < s.n)
    throw std::logic_error("gemm: a leading dimension is smaller than its row length");
  const bool automatic = kernel == GemmKernel::automatic;
  if (automatic) kernel = gemm_kernel_for(ctx, b.dtype);
  if (!is_scalar(kernel) && b.dtype != DType::f16)
    throw std::logic_error("gemm: the cooperative-matrix kernels take fp16 operands (or an fp32 A)");
  if (!gemm_kernel_available(ctx, kernel))
    throw std::logic_error("gemm: the " + gemm_kernel_name(kernel) + " kernel is not available on this device");
  if (s.k == 0 && !is_scalar(kernel)) {
    // C = beta * C: the scalar kernel handles K = 0 (no K tiles) exactly.
    kernel = GemmKernel::scalar;
  }
  // NV2's workgroup-wide tiles waste most of their work on thin products (LoRA's rank-r sides,
  // short chunks): those go to the subgroup-scope family with its 64x64 tile.
  if (automatic && kernel == GemmKernel::nv_coopmat2 && (s.m < 128 || s.n < 128))
    kernel = khr_available(ctx) ? GemmKernel::khr_coopmat : coopmat_available(ctx) ? GemmKernel::coopmat
                                                                                   : GemmKernel::nv_coopmat2;
  if (kernel == GemmKernel::khr_coopmat) frag = ctx.info().khr_fragment;
  const uint32_t slices = kernel == GemmKernel::nv_coopmat2 ? nv2_split_k_slices(s, ctx.info())
                                                            : std::min(gemm_split_k_slices(s), s.k);
  if (slices > 1) return gemm_split_k(ctx, s, slices, a, b, c, kernel, frag, copies);
  dispatch_part(ctx, s, a, a.offset, b, b.offset, c, c.offset, kernel, frag);
  for (const GemmF16Copy& d : copies)
    to_f16_block(ctx, c.buffer, c.offset, c.ld, d.buffer, d.offset, d.ld, s.m, s.n, d.width);
}

}  // namespace

void gemm(gpu::Context& ctx, const GemmShape& s, const MatrixView& a, const MatrixView& b, const MatrixView& c,
          GemmKernel kernel, std::span<const GemmF16Copy> copies) {
  run_gemm(ctx, s, a, b, c, kernel, kNvFragment, copies);
}

void gemm_emulated(gpu::Context& ctx, const GemmShape& s, const MatrixView& a, const MatrixView& b,
                   const MatrixView& c, const gpu::KhrFragment& fragment) {
  auto side_ok = [](uint32_t x) { return x == 8 || x == 16 || x == 32; };
  if (!side_ok(fragment.m) || !side_ok(fragment.n) || !side_ok(fragment.k) || fragment.subgroup_size == 0 ||
      (fragment.m * fragment.n) % fragment.subgroup_size)
    throw std::logic_error("gemm_emulated: unsupported fragment shape");
  run_gemm(ctx, s, a, b, c, GemmKernel::coopmat_emulated, fragment);
}

}  // namespace forja::ops
