#include "ops/attention_gemm.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernel_table.h"
#include "ops/attention_common.h"
#include "ops/chunking.h"
#include "ops/elementwise.h"

namespace forja::ops {

namespace {

// Must match the PC blocks of kernels/attention_gemm.comp.
struct PackPush {
  uint32_t seq, n_src, rep, head_dim;
  uint32_t src_off, dst_off;
  uint32_t count;
};
static_assert(kernels::push_block_matches<PackPush>(kernels::attn_gemm_pack, kernels::attn_gemm_sum_heads),
              "PackPush differs from kernels/attention_gemm.comp's push-constant block");
struct RowPush {
  uint32_t c0, keys, ldp, rows;
  uint32_t seq, n_heads, head_dim;
  float scale;
  uint32_t seg_off, lse_off, out_off, dout_off;
};
static_assert(kernels::push_block_matches<RowPush>(kernels::attn_gemm_softmax, kernels::attn_gemm_softmax_bwd),
              "RowPush differs from kernels/attention_gemm.comp's push-constant block");

constexpr uint32_t kPackThreads = 128;  // local_size_x of the kernels
constexpr uint32_t kMaxGroupsX = 65535;

uint32_t round_up8(uint32_t n) { return (n + 7u) / 8u * 8u; }

using Dims = AttentionDims;

void check(const gpu::Context& ctx, const char* op, const Dims& m, const AttentionGemmOptions& o) {
  check_attention_heads(op, m);
  const uint64_t usable = usable_binding_bytes(ctx);
  const uint64_t chunk = attention_gemm_chunk_rows(ctx, m.seq, m.nh, o);
  if (m.q_seq() * 4 > usable || uint64_t(m.nh) * chunk * round_up8(m.seq) * 4 > usable)
    throw std::invalid_argument(std::string(op) + ": one sequence of " + std::to_string(m.seq) +
                                " tokens needs bindings beyond the device's maxStorageBufferRange; lower the "
                                "sequence length or use --precision fp32");
}

uint32_t pack_grid(uint64_t items) {
  return static_cast<uint32_t>(std::clamp<uint64_t>((items + kPackThreads - 1) / kPackThreads, 1, kMaxGroupsX));
}

// fp16 [n_src * rep, S, d] copy of one sequence of src (fp32 [B*S, n_src, d]).
void pack(gpu::Context& ctx, const gpu::Buffer& src, uint32_t b, uint32_t n_src, uint32_t rep, const Dims& m,
          const gpu::Buffer& dst) {
  const uint64_t per_seq = uint64_t(m.seq) * n_src * m.d;
  const uint64_t halves = per_seq * rep;
  const Bound bs = bind_elements(ctx, src, b * per_seq, per_seq);
  const Bound bd = bind_elements(ctx, dst, 0, (halves + 1) / 2);
  const uint32_t pairs = static_cast<uint32_t>((halves + 1) / 2);
  const PackPush push{m.seq, n_src, rep, m.d, bs.offset, 2 * bd.offset, pairs};
  ctx.dispatch(ctx.pipelines().get(kernels::attn_gemm_pack),
               {{bs.buffer, gpu::Access::read}, {bd.buffer, gpu::Access::write}}, push, pack_grid(pairs), 1, 1,
               "attention_gemm_pack");
}

// dst (fp32 [B*S, nkv, d], sequence b) = the sum over each kv head's query heads of src [nh, S, d].
void sum_heads(gpu::Context& ctx, const gpu::Buffer& src, uint32_t b, const Dims& m, const gpu::Buffer& dst) {
  const Bound bs = bind_elements(ctx, src, 0, m.q_seq());
  const Bound bd = bind_elements(ctx, dst, b * m.kv_seq(), m.kv_seq());
  const uint32_t count = static_cast<uint32_t>(m.kv_seq());
  const PackPush push{m.seq, m.nkv, m.rep(), m.d, bs.offset, bd.offset, count};
  ctx.dispatch(ctx.pipelines().get(kernels::attn_gemm_sum_heads),
               {{bs.buffer, gpu::Access::read}, {bd.buffer, gpu::Access::write}}, push, pack_grid(count), 1, 1,
               "attention_gemm_sum_heads");
}

gpu::Buffer alloc_f16(gpu::Context& ctx, uint64_t halves, const char* what) {
  return ctx.alloc((halves + 7) / 8 * 16, what);
}

// Workgroups along the rows of a fused kernel: one per tile of `rows`, or one per pair of tiles
// (the kernels' PAIRED).
uint32_t row_groups(uint32_t seq, uint32_t rows, bool paired) {
  const uint32_t tiles = (seq + rows - 1) / rows;
  return paired ? (tiles + 1) / 2 : tiles;
}

// ---- the fused forward (kernels/flash_forward_khr.comp) ----
// Must match PC in kernels/flash_forward_khr.comp.
struct FusedPush {
  uint32_t seq, n_heads, n_kv_heads, head_dim;
  float scale;
  uint32_t q_off, k_off, v_off, seg_off, out_off, lse_off;
};
static_assert(kernels::push_block_matches<FusedPush>(kernels::flash_fwd_khr),
              "FusedPush differs from kernels/flash_forward_khr.comp's push-constant block");
}  // namespace

uint64_t attention_fused_forward_shared_bytes(uint32_t warps, uint32_t keys, uint32_t head_dim, bool emulated) {
  const uint64_t ld = head_dim / 8 + 1;  // uvec4 chunks per staged row, one of padding
  // The emulation's exchange arrays are per subgroup; the real kernel has none (one subgroup's
  // worth is counted anyway).
  return 16 * std::max<uint64_t>(2ull * keys * ld, 16ull * warps * ld) + 8ull * keys +
         4ull * (emulated ? warps : 1) * (256 + 256 + 32);
}

namespace {

// The forward's workgroups within what the kernel and the device allow: shared memory holds the
// staged k and v tiles, or the workgroup's q rows before the loop (kernels/flash_forward_khr.comp's
// SH_SIZE), the tile's segment ids and the emulation's exchange arrays.
void check_fused_forward_tiles(const gpu::Context& ctx, uint32_t warps, uint32_t keys, uint32_t head_dim,
                               bool emulated) {
  if (!(warps == 1 || warps == 2 || warps == 4 || warps == 8) || !(keys == 16 || keys == 32 || keys == 64))
    throw std::invalid_argument("fused attention forward tiles: subgroups must be 1, 2, 4 or 8 and tiles 16, 32 or 64");
  const uint64_t bytes = attention_fused_forward_shared_bytes(warps, keys, head_dim, emulated);
  if (bytes > ctx.info().max_shared_memory)
    throw std::invalid_argument("fused attention forward tiles: " + std::to_string(warps) + " subgroups and tiles of " +
                                std::to_string(keys) + " need " + std::to_string(bytes) +
                                " bytes of shared memory, the device has " +
                                std::to_string(ctx.info().max_shared_memory));
}

// The element order of a 16x16 fp32 accumulator that the fused kernel's softmax can work with:
// lane l holds rows l/4 and l/4 + 8 and columns 2 (l % 4) + {0, 1} and those + 8 (NVIDIA's
// m16n8k16 pattern); element i is in the row half (i >> row_shift) & 1 and the column half
// (i >> col_shift) & 1.
struct AccumulatorLayout {
  std::string unsupported;  // empty when one of the orders matched
  uint32_t row_shift = 0, col_shift = 0;
};

// coopmat_layout_probe's answer checked against both orders ({row, col} shifts {2, 1} and {1, 2}).
AccumulatorLayout probe_accumulator_layout(gpu::Context& ctx) {
  gpu::Buffer out = ctx.alloc(257 * 4, "accumulator layout probe");
  ctx.dispatch(ctx.pipelines().get(kernels::coopmat_layout_probe), {{out, gpu::Access::write}}, nullptr, 0, 1, 1, 1,
               "coopmat_layout_probe");
  const std::vector<float> v = ctx.download<float>(out, 257);
  ctx.free(out);
  if (v[256] != 8.0f) return {"the accumulator has " + std::to_string(v[256]) + " elements per lane, not 8"};
  for (const auto& [rs, cs] : {std::pair<uint32_t, uint32_t>{2, 1}, {1, 2}}) {
    bool match = true;
    for (uint32_t lane = 0; lane < 32 && match; ++lane)
      for (uint32_t i = 0; i < 8 && match; ++i) {
        const uint32_t r = lane / 4 + 8 * ((i >> rs) & 1), c = 2 * (lane % 4) + i % 2 + 8 * ((i >> cs) & 1);
        match = v[r * 16 + c] == float(lane * 64 + i);
      }
    if (match) return {"", rs, cs};
  }
  std::string seen;
  for (uint32_t i = 0; i < 8; ++i)
    for (uint32_t x = 0; x < 256; ++x)
      if (v[x] == float(i)) seen += " " + std::to_string(i) + "@(" + std::to_string(x / 16) + "," + std::to_string(x % 16) + ")";
  return {"the accumulator's elements are not in an order the fused kernel knows (lane 0:" + seen + ")"};
}

// The probe's answer for this device and driver, probed once per program (it cannot change
// while the program runs).
const AccumulatorLayout& accumulator_layout(gpu::Context& ctx) {
  static std::mutex mutex;
  static std::map<std::string, AccumulatorLayout> layouts;
  const gpu::DeviceInfo& info = ctx.info();
  const std::string key = std::to_string(info.vendor_id) + "/" + info.name + "/" + info.driver_name + "/" +
                          info.driver_info;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = layouts.find(key);
  if (it == layouts.end()) it = layouts.emplace(key, probe_accumulator_layout(ctx)).first;
  return it->second;
}

// The fused kernels as they run: the real ones on the probed accumulator order, or their
// emulation (AttentionGemmOptions::fused_emulated) on the order the options name.
struct FusedSetup {
  bool emulated = false;
  uint32_t row_shift = 0, col_shift = 0;
};
FusedSetup fused_setup(gpu::Context& ctx, const AttentionGemmOptions& o) {
  if (o.fused_emulated) {
    if (o.emulated_row_shift != 1 && o.emulated_row_shift != 2)
      throw std::logic_error("AttentionGemmOptions::emulated_row_shift must be 1 or 2");
    if (o.emulated_tile != 16 && o.emulated_tile != 32 && o.emulated_tile != 64)
      throw std::logic_error("AttentionGemmOptions::emulated_tile must be 16, 32 or 64");
    return {true, o.emulated_row_shift, 3 - o.emulated_row_shift};
  }
  const AccumulatorLayout& layout = accumulator_layout(ctx);
  return {false, layout.row_shift, layout.col_shift};
}
bool fused_runs(gpu::Context& ctx, uint32_t head_dim, const AttentionGemmOptions& o) {
  return attention_fused_kernels_run(ctx, head_dim, o);
}

// The forward as one kernel per group of sequences (kernels/flash_forward_khr.comp), on fp16
// copies of q, k, v that keep their [tokens, heads, d] layout (d is a multiple of 16).
void fused_forward(gpu::Context& ctx, const Dims& m, const gpu::Buffer& q, const gpu::Buffer& k,
                   const gpu::Buffer& v, const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                   float scale, const AttentionGemmOptions& o) {
  const FusedSetup f = fused_setup(ctx, o);
  // The ping-pong schedule needs two subgroups to show both roles; it has no prefetch.
  const bool pingpong = o.fused_forward_tiles.pingpong;
  const uint32_t warps = f.emulated ? (pingpong ? 2 : 1) : o.fused_forward_tiles.warps;
  const uint32_t keys = f.emulated ? o.emulated_tile : o.fused_forward_tiles.keys;
  check_fused_forward_tiles(ctx, warps, keys, m.d, f.emulated);
  const auto& p = ctx.pipelines().get(f.emulated ? kernels::flash_fwd_khr_emu : kernels::flash_fwd_khr,
                                      {warps * 32, warps, keys, m.d, f.row_shift, f.col_shift,
                                       o.fused_forward_tiles.prefetch && !pingpong ? 1u : 0u,
                                       o.fused_forward_tiles.paired ? 1u : 0u, pingpong ? 1u : 0u});
  const uint32_t rows_per_group = warps * 16;
  const uint32_t per = sequences_per_dispatch(ctx, "attention_gemm_forward", m);
  const uint32_t group = std::min(per, m.batch);
  if (o.qk_f16 && per < m.batch) throw std::logic_error("attention_gemm_forward: fp16 q and k need one dispatch");
  gpu::Buffer q16 = o.qk_f16 ? q : alloc_f16(ctx, group * m.q_seq(), "attention q fp16");
  gpu::Buffer k16 = o.qk_f16 ? k : alloc_f16(ctx, group * m.kv_seq(), "attention k fp16");
  gpu::Buffer v16 = alloc_f16(ctx, group * m.kv_seq(), "attention v fp16");
  const uint32_t q_width = m.nh * m.d, kv_width = m.nkv * m.d;
  for (uint32_t b0 = 0; b0 < m.batch; b0 += per) {
    const uint32_t nb = std::min(per, m.batch - b0), tokens = nb * m.seq;
    if (!o.qk_f16) {
      to_f16_block(ctx, q, uint64_t(b0) * m.q_seq(), q_width, q16, 0, q_width, tokens, q_width, q_width);
      to_f16_block(ctx, k, uint64_t(b0) * m.kv_seq(), kv_width, k16, 0, kv_width, tokens, kv_width, kv_width);
    }
    to_f16_block(ctx, v, uint64_t(b0) * m.kv_seq(), kv_width, v16, 0, kv_width, tokens, kv_width, kv_width);
    const AttentionBindings f = bind_attention(ctx, m, b0, nb, q, k, v, segments, out, lse);
    const FusedPush push{m.seq, m.nh, m.nkv, m.d, scale, 0, 0, 0, f.segments.offset, f.out.offset, f.lse.offset};
    const double flops = 2.0 * 2.0 * nb * m.nh * (0.5 * m.seq * (m.seq + 1.0)) * m.d;
    ctx.dispatch(p,
                 {{q16, gpu::Access::read},
                  {k16, gpu::Access::read},
                  {v16, gpu::Access::read},
                  {f.segments.buffer, gpu::Access::read},
                  {f.out.buffer, gpu::Access::write},
                  {f.lse.buffer, gpu::Access::write}},
                 push, row_groups(m.seq, rows_per_group, o.fused_forward_tiles.paired), m.nh, nb,
                 "attention_fused_forward", flops);
  }
  ctx.free(v16);
  if (!o.qk_f16)
    for (const gpu::Buffer& b : {q16, k16}) ctx.free(b);
}

// ---- the fused backward (kernels/flash_backward_khr.comp) ----
// Must match PC in kernels/flash_backward_khr.comp.
struct FusedBackwardPush {
  uint32_t seq, n_heads, n_kv_heads, head_dim;
  float scale;
  uint32_t seg_off, lse_off, drow_off, out_off, dv_off;
  uint32_t split, part_stride;
};
static_assert(kernels::push_block_matches<FusedBackwardPush>(kernels::flash_bwd_dq_khr, kernels::flash_bwd_dkv_khr),
              "FusedBackwardPush differs from kernels/flash_backward_khr.comp's push-constant block");
// Must match PC in kernels/attention_row_dot.comp.
struct RowDotPush {
  uint32_t rows, n_heads, head_dim, seq;
  uint32_t out_off, dout_off, drow_off;
  uint32_t out_ld;
};
static_assert(kernels::push_block_matches<RowDotPush>(kernels::attention_row_dot, kernels::attention_row_dot_f16),
              "RowDotPush differs from kernels/attention_row_dot.comp's push-constant block");
// Shared memory of one backward workgroup (kernels/flash_backward_khr.comp's SH_SIZE, the segment,
// lse and D arrays, and the emulation's exchange arrays) for `warps` subgroups and tiles of `tile`:
// the dq kernel stages its own rows where the tiles go later, the dk/dv kernel keeps v's beside them.
uint64_t fused_backward_shared_bytes(bool dq, uint32_t warps, uint32_t tile, uint32_t head_dim) {
  const uint64_t ld = head_dim / 8 + 1, rows = 16ull * warps;
  const uint64_t staged = dq ? std::max(2 * tile * ld, rows * ld) : 2 * tile * ld + rows * ld;
  return 16 * staged + 3 * 4 * tile + 4 * (256 + 256 + 32);
}

void check_fused_backward_tiles(const gpu::Context& ctx, const AttentionGemmOptions::FusedBackwardTiles& t,
                                uint32_t head_dim) {
  auto warps_ok = [](uint32_t w) { return w == 1 || w == 2 || w == 4 || w == 8; };
  auto tile_ok = [](uint32_t b) { return b == 16 || b == 32 || b == 64; };
  if (!warps_ok(t.dq_warps) || !warps_ok(t.kv_warps) || !tile_ok(t.dq_keys) || !tile_ok(t.kv_queries))
    throw std::invalid_argument("fused attention backward tiles: subgroups must be 1, 2, 4 or 8 and tiles 16, 32 or 64");
  const uint64_t limit = ctx.info().max_shared_memory;
  for (const bool dq : {true, false}) {
    const uint32_t warps = dq ? t.dq_warps : t.kv_warps, tile = dq ? t.dq_keys : t.kv_queries;
    const uint64_t bytes = fused_backward_shared_bytes(dq, warps, tile, head_dim);
    if (bytes > limit)
      throw std::invalid_argument(std::string("fused attention backward tiles: ") + (dq ? "dq" : "dk/dv") + " with " +
                                  std::to_string(warps) + " subgroups and tiles of " + std::to_string(tile) + " needs " +
                                  std::to_string(bytes) + " bytes of shared memory, the device has " +
                                  std::to_string(limit));
  }
}

// The dq kernel that reads dS: its shared memory (kernels/flash_backward_khr.comp's SH_SIZE with
// FROM_DS: a key tile of k, the workgroup's rows of dS for it, the segment ids, the emulation's
// arrays) within the device's.
void check_fused_dq_ds_tiles(const gpu::Context& ctx, uint32_t warps, uint32_t keys, uint32_t head_dim,
                             bool emulated) {
  const uint64_t bytes = 16 * (uint64_t(keys) * (head_dim / 8 + 1) + 16ull * warps * (keys / 8 + 1)) + 4ull * keys +
                         (emulated ? 4ull * warps * (256 + 256 + 32) : 0);
  if (bytes > ctx.info().max_shared_memory)
    throw std::invalid_argument("fused attention backward: dq from dS with " + std::to_string(warps) +
                                " subgroups and key tiles of " + std::to_string(keys) + " needs " +
                                std::to_string(bytes) + " bytes of shared memory, the device has " +
                                std::to_string(ctx.info().max_shared_memory));
}

// Whether the backward of `sequences` in one dispatch takes dq from dS through memory
// (AttentionGemmOptions::dq_from_ds): asked for, and its dS within a binding and kMaxDsBytes.
constexpr uint64_t kMaxDsBytes = 2ull << 30;
bool uses_ds(const gpu::Context& ctx, uint32_t sequences, const Dims& m, const AttentionGemmOptions& o,
             const AttentionGemmOptions::FusedBackwardTiles& t) {
  const uint64_t bytes = attention_ds_bytes(sequences, m.seq, m.nh, t);
  return o.dq_from_ds && bytes <= std::min(kMaxDsBytes, usable_binding_bytes(ctx));
}

// Sequences [b0, b0 + nb) of an fp16 [tokens, ld] buffer as a binding, its offset in halves.
Bound bind_f16_rows(const gpu::Context& ctx, const gpu::Buffer& b, uint32_t b0, uint32_t nb, uint32_t seq, uint32_t ld) {
  const uint64_t row_bytes = uint64_t(ld) * 2;
  const Window w = window(ctx, b, uint64_t(b0) * seq * row_bytes, uint64_t(nb) * seq * row_bytes, 2);
  return {w.view, w.first};
}

// out_f16_ld > 0: out is fp16 (AttentionGemmOptions::out_f16_ld), its offset in halves.
// dout16: where given, receives dout in fp16 from its start.
void row_dot(gpu::Context& ctx, const Dims& m, uint32_t nb, const Bound& out, const Bound& dout, const Bound& drow,
             uint32_t out_f16_ld, const gpu::Buffer* dout16) {
  const uint32_t rows = nb * m.seq * m.nh;
  const RowDotPush push{rows, m.nh, m.d, m.seq, out.offset, dout.offset, drow.offset, out_f16_ld};
  const kernels::Kernel& kernel =
      dout16 ? (out_f16_ld ? kernels::attention_row_dot_f16_dout16 : kernels::attention_row_dot_dout16)
             : (out_f16_ld ? kernels::attention_row_dot_f16 : kernels::attention_row_dot);
  std::vector<gpu::Binding> bindings = {
      {out.buffer, gpu::Access::read}, {dout.buffer, gpu::Access::read}, {drow.buffer, gpu::Access::write}};
  if (dout16) bindings.push_back({*dout16, gpu::Access::write});
  const auto groups = static_cast<uint32_t>(std::clamp<uint64_t>((uint64_t(rows) + 7) / 8, 1, kMaxGroupsX));
  ctx.dispatch(ctx.pipelines().get(kernel), bindings, push, groups, 1, 1, "attention_row_dot", 2.0 * rows * m.d);
}

// The backward as two kernels per group of sequences, on fp16 copies of q, k, v and dout that
// keep their [tokens, heads, d] layout, after D = rowsum(dout * out) (attention_row_dot.comp).
void fused_backward(gpu::Context& ctx, const Dims& m, const gpu::Buffer& q, const gpu::Buffer& k,
                    const gpu::Buffer& v, const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                    const gpu::Buffer& dout, const gpu::Buffer& dq, const gpu::Buffer& dk, const gpu::Buffer& dv,
                    float scale, const AttentionGemmOptions& o) {
  const FusedSetup fs = fused_setup(ctx, o);
  // The emulation runs one subgroup per workgroup, on tiles that fit lavapipe's shared memory.
  const AttentionGemmOptions::FusedBackwardTiles t =
      fs.emulated ? AttentionGemmOptions::FusedBackwardTiles{1, o.emulated_tile, 1, o.emulated_tile,
                                                             o.fused_backward_tiles.paired}
                  : o.fused_backward_tiles;
  check_fused_backward_tiles(ctx, t, m.d);
  const uint32_t dq_warps = t.dq_warps, kv_warps = t.kv_warps;
  auto pipeline = [&](const kernels::Kernel& kernel, const kernels::Kernel& emulation, uint32_t warps,
                      uint32_t tile) -> const gpu::Pipeline& {
    return ctx.pipelines().get(fs.emulated ? emulation : kernel,
                               {warps * 32, warps, tile, m.d, fs.row_shift, fs.col_shift, t.paired ? 1u : 0u});
  };
  const uint32_t per = sequences_per_dispatch(ctx, "attention_gemm_backward", m);
  const uint32_t group = std::min(per, m.batch);
  // dq from dS through memory where one dispatch's dS fits (the emulation: one subgroup per
  // workgroup, as the other kernels)
  const bool from_ds = uses_ds(ctx, group, m, o, t);
  // dq from dS by subgroups 2 x 2 where the shapes allow (the emulation: one such workgroup of 4)
  const bool quad = o.dq_ds_quad && m.d % 32 == 0 && t.kv_queries >= 32 && (fs.emulated || o.dq_ds_warps % 2 == 0);
  const uint32_t ds_warps = fs.emulated ? (quad ? 4 : 1) : o.dq_ds_warps, ds_keys = 16 * kv_warps;
  if (from_ds) check_fused_dq_ds_tiles(ctx, ds_warps, ds_keys, m.d, fs.emulated);
  const kernels::Kernel& dq_ds_kernel =
      quad ? (fs.emulated ? kernels::flash_bwd_dq_ds_quad_khr_emu : kernels::flash_bwd_dq_ds_quad_khr)
           : (fs.emulated ? kernels::flash_bwd_dq_ds_khr_emu : kernels::flash_bwd_dq_ds_khr);
  const gpu::Pipeline& p_dq =
      from_ds ? ctx.pipelines().get(dq_ds_kernel, {ds_warps * 32, ds_warps, ds_keys, m.d, fs.row_shift, fs.col_shift,
                                                   t.paired ? 1u : 0u, t.kv_queries})
              : pipeline(kernels::flash_bwd_dq_khr, kernels::flash_bwd_dq_khr_emu, dq_warps, t.dq_keys);
  const gpu::Pipeline& p_dkv =
      from_ds ? pipeline(kernels::flash_bwd_dkv_ds_khr, kernels::flash_bwd_dkv_ds_khr_emu, kv_warps, t.kv_queries)
              : pipeline(kernels::flash_bwd_dkv_khr, kernels::flash_bwd_dkv_khr_emu, kv_warps, t.kv_queries);
  const gpu::Buffer ds =
      from_ds ? ctx.alloc(attention_ds_bytes(group, m.seq, m.nh, t), "attention dS (fp16)") : gpu::Buffer{};
  if (o.qk_f16 && per < m.batch) throw std::logic_error("attention_gemm_backward: fp16 q and k need one dispatch");
  gpu::Buffer q16 = o.qk_f16 ? q : alloc_f16(ctx, group * m.q_seq(), "attention q fp16");
  gpu::Buffer k16 = o.qk_f16 ? k : alloc_f16(ctx, group * m.kv_seq(), "attention k fp16");
  gpu::Buffer v16 = alloc_f16(ctx, group * m.kv_seq(), "attention v fp16");
  gpu::Buffer do16 = alloc_f16(ctx, group * m.q_seq(), "attention dout fp16");
  gpu::Buffer drow = ctx.alloc(group * m.stat_seq() * 4, "attention D = rowsum(dout * out)");
  const uint32_t q_width = m.nh * m.d, kv_width = m.nkv * m.d;
  const double pairs = 0.5 * m.seq * (m.seq + 1.0);  // causal (query, key) pairs per head
  for (uint32_t b0 = 0; b0 < m.batch; b0 += per) {
    const uint32_t nb = std::min(per, m.batch - b0), tokens = nb * m.seq;
    if (!o.qk_f16) {
      to_f16_block(ctx, q, uint64_t(b0) * m.q_seq(), q_width, q16, 0, q_width, tokens, q_width, q_width);
      to_f16_block(ctx, k, uint64_t(b0) * m.kv_seq(), kv_width, k16, 0, kv_width, tokens, kv_width, kv_width);
    }
    to_f16_block(ctx, v, uint64_t(b0) * m.kv_seq(), kv_width, v16, 0, kv_width, tokens, kv_width, kv_width);
    const AttentionBindings f = bind_attention(ctx, m, b0, nb, q, k, v, segments, out, lse, o.out_f16_ld == 0);
    const Bound bdout = bind_elements(ctx, dout, b0 * m.q_seq(), nb * m.q_seq());
    const Bound bdrow = bind_elements(ctx, drow, 0, nb * m.stat_seq());
    // D, and dout's fp16 copy in the same pass
    row_dot(ctx, m, nb, o.out_f16_ld ? bind_f16_rows(ctx, out, b0, nb, m.seq, o.out_f16_ld) : f.out, bdout, bdrow,
            o.out_f16_ld, &do16);
    auto run = [&](const gpu::Pipeline& p, const Bound& grad, const Bound* grad_v, uint32_t rows_per_group,
                   uint32_t heads, uint32_t split, uint32_t part_stride, double products, const char* op,
                   gpu::Access ds_access) {
      const FusedBackwardPush push{m.seq,        m.nh,         m.nkv,       m.d,
                                   scale,        f.segments.offset, f.lse.offset, bdrow.offset,
                                   grad.offset,  grad_v ? grad_v->offset : 0,    split,       part_stride};
      std::vector<gpu::Binding> bindings = {{q16, gpu::Access::read},
                                            {k16, gpu::Access::read},
                                            {v16, gpu::Access::read},
                                            {do16, gpu::Access::read},
                                            {f.segments.buffer, gpu::Access::read},
                                            {f.lse.buffer, gpu::Access::read},
                                            {bdrow.buffer, gpu::Access::read},
                                            {grad.buffer, gpu::Access::write}};
      if (grad_v) bindings.push_back({grad_v->buffer, gpu::Access::write});
      if (from_ds) bindings.push_back({ds, ds_access});
      ctx.dispatch(p, bindings, push, row_groups(m.seq, rows_per_group, t.paired), heads * split, nb, op,
                   products * 2.0 * nb * m.nh * pairs * m.d);
    };
    // dq: S, dP, dS K, or dS K with dS from the dk/dv kernel, after it; dk and dv: S^T, dP^T,
    // dS^T Q, P^T dout (products per visible pair).
    auto run_dq = [&] {
      run(p_dq, bind_elements(ctx, dq, b0 * m.q_seq(), nb * m.q_seq()), nullptr, (from_ds ? ds_warps : dq_warps) * 16,
          m.nh, 1, 0, from_ds ? 1 : 3, from_ds ? "attention_fused_backward_dq_ds" : "attention_fused_backward_dq",
          gpu::Access::read);
    };
    if (!from_ds) run_dq();
    const uint64_t kv_elements = nb * m.kv_seq();
    AttentionGemmOptions tiled = o;  // the tiles this call runs (the emulation's one subgroup)
    tiled.fused_backward_tiles = t;
    const uint32_t split = attention_dkv_split(nb, m.seq, m.nh, m.nkv, tiled);
    if (split == 1) {
      const Bound bdv = bind_elements(ctx, dv, b0 * m.kv_seq(), kv_elements);
      run(p_dkv, bind_elements(ctx, dk, b0 * m.kv_seq(), kv_elements), &bdv, kv_warps * 16, m.nkv, 1, 0, 4,
          "attention_fused_backward_dkv", gpu::Access::write);
    } else {
      // Each of the split workgroups of a kv head writes its partial sums; then they are summed.
      const gpu::Buffer dk_parts = ctx.alloc(split * kv_elements * 4, "attention dk partial sums");
      const gpu::Buffer dv_parts = ctx.alloc(split * kv_elements * 4, "attention dv partial sums");
      const Bound bdv{dv_parts, 0};
      run(p_dkv, Bound{dk_parts, 0}, &bdv, kv_warps * 16, m.nkv, split, static_cast<uint32_t>(kv_elements), 4,
          "attention_fused_backward_dkv", gpu::Access::write);
      const uint32_t rows = nb * m.seq, cols = m.nkv * m.d;
      gemm_sum_slices(ctx, dk_parts, split, rows, cols, MatrixView{dk, DType::f32, b0 * m.kv_seq(), cols}, 0.0f,
                      "attention_dkv_sum");
      gemm_sum_slices(ctx, dv_parts, split, rows, cols, MatrixView{dv, DType::f32, b0 * m.kv_seq(), cols}, 0.0f,
                      "attention_dkv_sum");
      for (const gpu::Buffer& b : {dk_parts, dv_parts}) ctx.free(b);
    }
    if (from_ds) run_dq();
  }
  for (const gpu::Buffer& b : {v16, do16, drow}) ctx.free(b);
  if (from_ds) ctx.free(ds);
  if (!o.qk_f16)
    for (const gpu::Buffer& b : {q16, k16}) ctx.free(b);
}

// One query chunk: rows [c0, c0 + rows) of a sequence against keys [0, keys), keys = c0 + rows.
struct Chunk {
  uint32_t c0, rows, keys, ldp;
};

// scores [nh, rows, ldp] = scale * q_chunk k^T, per query head, from the fp16 [nh, S, d] copies.
void scores_product(gpu::Context& ctx, const gpu::Buffer& q16, const gpu::Buffer& k16, const Dims& m, const Chunk& c,
                    float scale, const gpu::Buffer& scores, GemmKernel kernel) {
  GemmShape s;
  s.m = c.rows, s.n = c.keys, s.k = m.d, s.trans_b = true, s.alpha = scale, s.op = "attention_gemm_scores";
  s.batch = m.nh, s.a_stride = uint64_t(m.seq) * m.d, s.b_stride = uint64_t(m.seq) * m.d,
  s.c_stride = uint64_t(c.rows) * c.ldp;
  gemm(ctx, s, {q16, DType::f16, uint64_t(c.c0) * m.d, m.d}, {k16, DType::f16, 0, m.d},
       {scores, DType::f32, 0, c.ldp}, kernel);
}

RowPush row_push(const Dims& m, const Chunk& c, float scale, const Bound& seg, const Bound& lse, uint32_t out_off,
                 uint32_t dout_off) {
  return {c.c0, c.keys, c.ldp, c.rows, m.seq, m.nh, m.d, scale, seg.offset, lse.offset, out_off, dout_off};
}

}  // namespace

uint32_t attention_gemm_chunk_rows(const gpu::Context& ctx, uint32_t seq, uint32_t n_heads,
                                   const AttentionGemmOptions& o) {
  return attention_gemm_chunk_rows(seq, n_heads, o, usable_binding_bytes(ctx));
}

uint32_t attention_gemm_chunk_rows(uint32_t seq, uint32_t n_heads, const AttentionGemmOptions& o,
                                   uint64_t max_binding_bytes) {
  if (seq == 0) return 1;
  if (o.chunk_rows != 0) return std::min(o.chunk_rows, seq);
  const uint64_t budget = std::min<uint64_t>(o.scratch_budget, max_binding_bytes);
  const uint64_t row_bytes = uint64_t(n_heads) * round_up8(seq) * 4;
  uint64_t rows = std::max<uint64_t>(budget / row_bytes, 1);
  if (rows >= 16) rows = rows / 16 * 16;  // whole 16-row tiles of the matrix-core kernels
  return static_cast<uint32_t>(std::min<uint64_t>({rows, seq, kMaxGroupsX}));
}

uint64_t attention_gemm_scratch_bytes(uint32_t seq, uint32_t n_heads, uint32_t head_dim, uint32_t chunk_rows) {
  const uint64_t heads = uint64_t(n_heads) * seq * head_dim;
  const uint64_t chunk = uint64_t(n_heads) * chunk_rows * round_up8(seq);
  // q, k, v, dout in fp16; dk, dv per query head in fp32; scores and dP fp32, P and dS fp16.
  return 4 * heads * 2 + 2 * heads * 4 + chunk * (4 + 4 + 2 + 2);
}

void attention_row_dot(gpu::Context& ctx, const gpu::Buffer& out, const gpu::Buffer& dout, const gpu::Buffer& drow,
                       uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t head_dim, uint32_t out_f16_ld,
                       const gpu::Buffer* dout16) {
  const Dims m{batch, seq, n_heads, n_heads, head_dim};
  if (batch == 0 || seq == 0) return;
  if (head_dim % 2) throw std::invalid_argument("attention_row_dot: head_dim " + std::to_string(head_dim) + " is odd");
  check_attention_out("attention_row_dot", m, out, out_f16_ld);
  check_attention_buffer("attention_row_dot", "dout", dout, m.q_seq() * batch);
  check_attention_buffer("attention_row_dot", "drow", drow, m.stat_seq() * batch);
  if (dout16 && dout16->size < m.q_seq() * batch * 2)
    throw std::invalid_argument("attention_row_dot: buffer 'dout16' has " + std::to_string(dout16->size) +
                                " bytes, the shape needs " + std::to_string(m.q_seq() * batch * 2));
  // The fp16 copy is written from the start of dout16: one dispatch for all sequences.
  const uint32_t per = dout16 ? batch : sequences_per_dispatch(ctx, "attention_row_dot", m);
  if (dout16 && per > sequences_per_dispatch(ctx, "attention_row_dot", m))
    throw std::invalid_argument("attention_row_dot: the fp16 dout of " + std::to_string(batch) +
                                " sequences exceeds one binding");
  for (uint32_t b0 = 0; b0 < batch; b0 += per) {
    const uint32_t nb = std::min(per, batch - b0);
    row_dot(ctx, m, nb,
            out_f16_ld ? bind_f16_rows(ctx, out, b0, nb, seq, out_f16_ld)
                       : bind_elements(ctx, out, b0 * m.q_seq(), nb * m.q_seq()),
            bind_elements(ctx, dout, b0 * m.q_seq(), nb * m.q_seq()),
            bind_elements(ctx, drow, b0 * m.stat_seq(), nb * m.stat_seq()), out_f16_ld, dout16);
  }
}

uint64_t attention_ds_bytes(uint32_t sequences, uint32_t seq, uint32_t n_heads,
                            const AttentionGemmOptions::FusedBackwardTiles& t) {
  const uint64_t g = std::max<uint64_t>(16ull * t.kv_warps, t.kv_queries), blocks = (seq + g - 1) / g;
  const uint64_t halves = uint64_t(sequences) * n_heads * g * g * (blocks * (blocks + 1) / 2);
  return (halves + 7) / 8 * 16;  // alloc_f16
}

bool attention_dq_from_ds_default() {
  static const bool on = gpu::env_flag_default_on("FORJA_ATTENTION_DQ_FROM_DS");
  return on;
}

bool attention_dq_ds_quad_default() {
  static const bool on = gpu::env_flag_default_on("FORJA_ATTENTION_DQ_DS_QUAD");
  return on;
}

uint64_t attention_fused_scratch_bytes(uint32_t sequences, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads,
                                       uint32_t head_dim, bool qk_f16) {
  const Dims m{sequences, seq, n_heads, n_kv_heads, head_dim};
  auto f16 = [](uint64_t halves) { return (halves + 7) / 8 * 16; };  // alloc_f16
  const uint64_t copies = qk_f16 ? f16(sequences * m.q_seq()) + f16(sequences * m.kv_seq())  // dout, v
                                 : 2 * f16(sequences * m.q_seq()) + 2 * f16(sequences * m.kv_seq());
  const uint32_t split = attention_dkv_split(sequences, seq, n_heads, n_kv_heads);
  const uint64_t parts = split > 1 ? 2ull * split * sequences * m.kv_seq() * 4 : 0;  // dk's and dv's
  const AttentionGemmOptions o;
  const uint64_t ds = attention_ds_bytes(sequences, seq, n_heads, o.fused_backward_tiles);
  return copies + sequences * m.stat_seq() * 4 + parts + (o.dq_from_ds && ds <= kMaxDsBytes ? ds : 0);
}

uint32_t attention_dkv_split(uint32_t sequences, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads,
                             const AttentionGemmOptions& o) {
  if (n_kv_heads == 0 || n_heads % n_kv_heads || o.dkv_split_target == 0) return 1;
  const uint32_t rep = n_heads / n_kv_heads, rows = 16 * o.fused_backward_tiles.kv_warps;
  const uint64_t groups = uint64_t(row_groups(seq, rows, o.fused_backward_tiles.paired)) * n_kv_heads * sequences;
  uint32_t split = 1;
  for (uint32_t d = 1; d <= rep && groups * split < o.dkv_split_target; ++d)
    if (rep % d == 0) split = d;
  return split;
}

bool attention_gemm_takes_f16_qk(gpu::Context& ctx, uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads,
                                 uint32_t head_dim, const AttentionGemmOptions& o) {
  const Dims m{batch, seq, n_heads, n_kv_heads, head_dim};
  if (batch == 0 || seq == 0 || !o.fused_forward || !o.fused_backward || !fused_runs(ctx, head_dim, o)) return false;
  return sequences_per_dispatch(ctx, "attention_gemm_forward", m) >= batch &&
         sequences_per_dispatch(ctx, "attention_gemm_backward", m) >= batch;
}

bool attention_fused_kernels_run(gpu::Context& ctx, uint32_t head_dim, const AttentionGemmOptions& o) {
  if (o.fused_emulated) return head_dim % 16 == 0 && head_dim > 0 && head_dim <= 128;
  return attention_fused_forward_supported(ctx, head_dim);
}

bool attention_paired_default() {
  static const bool paired = gpu::env_flag_default_on("FORJA_ATTENTION_PAIRED");
  return paired;
}
bool attention_pingpong_default() {
  static const bool pingpong = gpu::env_flag("FORJA_ATTENTION_PINGPONG");
  return pingpong;
}

bool attention_fused_backward_enabled(gpu::Context& ctx, uint32_t head_dim) {
  if (gpu::env_flag("FORJA_NO_FUSED_ATTENTION_BACKWARD") || !attention_fused_forward_supported(ctx, head_dim))
    return false;
  // The default tiles within the device's shared memory (every device that runs the fused
  // forward today has 48 KB or more; they need 35 KB at head_dim 128).
  const AttentionGemmOptions::FusedBackwardTiles t;
  return std::max(fused_backward_shared_bytes(true, t.dq_warps, t.dq_keys, head_dim),
                  fused_backward_shared_bytes(false, t.kv_warps, t.kv_queries, head_dim)) <= ctx.info().max_shared_memory;
}

std::string attention_fused_forward_unsupported(gpu::Context& ctx, uint32_t head_dim) {
  const gpu::DeviceInfo& info = ctx.info();
  if (head_dim == 0 || head_dim % 16 != 0 || head_dim > 128)
    return "head_dim " + std::to_string(head_dim) + " is not a multiple of 16 up to 128";
  if (gpu::env_flag("FORJA_NO_COOPMAT")) return "FORJA_NO_COOPMAT is set";
  if (gpu::env_flag("FORJA_NO_FUSED_ATTENTION")) return "FORJA_NO_FUSED_ATTENTION is set";
  if (!kernels::flash_fwd_khr.built || !kernels::coopmat_layout_probe.built)
    return "this build has no KHR / NV cooperative-matrix-2 kernels (a glslang >= 15 is needed)";
  if (!info.nv_coopmat2) return "the device has no NV cooperative matrix 2 (conversions between uses)";
  if (info.subgroup_size != 32) return "the subgroup size is " + std::to_string(info.subgroup_size) + ", not 32";
  bool khr = false;
  for (const gpu::CoopMatShape& e : info.khr_coopmat_shapes)
    khr = khr || (e.m == 16 && e.n == 16 && e.k == 16 && e.a_type == "f16" && e.b_type == "f16" &&
                  e.c_type == "f32" && e.result_type == "f32");
  if (!khr) return "the device lists no KHR cooperative matrix 16x16x16 fp16 x fp16 + fp32";
  return accumulator_layout(ctx).unsupported;
}

void attention_gemm_forward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                            const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                            uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                            float scale, const AttentionGemmOptions& o) {
  const char* op = "attention_gemm_forward";
  const Dims m{batch, seq, n_heads, n_kv_heads, head_dim};
  if (batch == 0 || seq == 0) return;
  check(ctx, op, m, o);
  check_attention_operands(op, m, q, k, v, segments, out, lse);
  if (o.fused_forward && fused_runs(ctx, head_dim, o)) return fused_forward(ctx, m, q, k, v, segments, out, lse, scale, o);
  if (o.qk_f16) throw std::logic_error("attention_gemm_forward: fp16 q and k are for the fused kernels only");

  const uint32_t C = attention_gemm_chunk_rows(ctx, seq, n_heads, o);
  const uint64_t chunk_elems = uint64_t(n_heads) * C * round_up8(seq);
  gpu::Buffer q16 = alloc_f16(ctx, m.q_seq(), "attention q fp16");
  gpu::Buffer k16 = alloc_f16(ctx, m.q_seq(), "attention k fp16");
  gpu::Buffer v16 = alloc_f16(ctx, m.q_seq(), "attention v fp16");
  gpu::Buffer scores = ctx.alloc(chunk_elems * 4, "attention scores");
  gpu::Buffer p16 = alloc_f16(ctx, chunk_elems, "attention P");
  const auto& softmax = ctx.pipelines().get(kernels::attn_gemm_softmax);
  for (uint32_t b = 0; b < batch; ++b) {
    pack(ctx, q, b, n_heads, 1, m, q16);
    pack(ctx, k, b, n_kv_heads, m.rep(), m, k16);
    pack(ctx, v, b, n_kv_heads, m.rep(), m, v16);
    const Bound bseg = bind_elements(ctx, segments, uint64_t(b) * seq, seq);
    const Bound blse = bind_elements(ctx, lse, uint64_t(b) * n_heads * seq, uint64_t(n_heads) * seq);
    for (uint32_t c0 = 0; c0 < seq; c0 += C) {
      const uint32_t rows = std::min(C, seq - c0);
      const Chunk c{c0, rows, c0 + rows, round_up8(c0 + rows)};
      const uint64_t elems = uint64_t(n_heads) * rows * c.ldp;
      scores_product(ctx, q16, k16, m, c, scale, scores, o.kernel);
      const Bound bsc = bind_elements(ctx, scores, 0, elems);
      const Bound bp = bind_elements(ctx, p16, 0, elems / 2);
      ctx.dispatch(softmax,
                   {{bsc.buffer, gpu::Access::read},
                    {bseg.buffer, gpu::Access::read},
                    {bp.buffer, gpu::Access::write},
                    {blse.buffer, gpu::Access::write}},
                   row_push(m, c, scale, bseg, blse, 0, 0), rows, n_heads, 1, "attention_gemm_softmax");
      // out rows of the chunk = P v, per query head.
      GemmShape s;
      s.m = rows, s.n = head_dim, s.k = c.keys, s.op = "attention_gemm_pv";
      s.batch = n_heads, s.a_stride = uint64_t(rows) * c.ldp, s.b_stride = uint64_t(seq) * head_dim,
      s.c_stride = head_dim;
      gemm(ctx, s, {p16, DType::f16, 0, c.ldp}, {v16, DType::f16, 0, head_dim},
           {out, DType::f32, (uint64_t(b) * seq + c0) * n_heads * head_dim, n_heads * head_dim}, o.kernel);
    }
  }
  for (const gpu::Buffer& buf : {q16, k16, v16, scores, p16}) ctx.free(buf);
}

void attention_gemm_backward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                             const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                             const gpu::Buffer& dout, const gpu::Buffer& dq, const gpu::Buffer& dk,
                             const gpu::Buffer& dv, uint32_t batch, uint32_t seq, uint32_t n_heads,
                             uint32_t n_kv_heads, uint32_t head_dim, float scale, const AttentionGemmOptions& o) {
  const char* op = "attention_gemm_backward";
  const Dims m{batch, seq, n_heads, n_kv_heads, head_dim};
  if (batch == 0 || seq == 0) return;
  check(ctx, op, m, o);
  check_attention_operands(op, m, q, k, v, segments, out, lse, o.out_f16_ld);
  check_attention_gradients(op, m, dout, dq, dk, dv);
  if (o.fused_backward && fused_runs(ctx, head_dim, o))
    return fused_backward(ctx, m, q, k, v, segments, out, lse, dout, dq, dk, dv, scale, o);
  if (o.qk_f16) throw std::logic_error("attention_gemm_backward: fp16 q and k are for the fused kernels only");
  if (o.out_f16_ld) throw std::logic_error("attention_gemm_backward: an fp16 out is for the fused kernels only");

  const uint32_t C = attention_gemm_chunk_rows(ctx, seq, n_heads, o);
  const uint64_t chunk_elems = uint64_t(n_heads) * C * round_up8(seq);
  gpu::Buffer q16 = alloc_f16(ctx, m.q_seq(), "attention q fp16");
  gpu::Buffer k16 = alloc_f16(ctx, m.q_seq(), "attention k fp16");
  gpu::Buffer v16 = alloc_f16(ctx, m.q_seq(), "attention v fp16");
  gpu::Buffer do16 = alloc_f16(ctx, m.q_seq(), "attention dout fp16");
  gpu::Buffer dk_heads = ctx.alloc(m.q_seq() * 4, "attention dk per query head");
  gpu::Buffer dv_heads = ctx.alloc(m.q_seq() * 4, "attention dv per query head");
  gpu::Buffer scores = ctx.alloc(chunk_elems * 4, "attention scores");
  gpu::Buffer dp = ctx.alloc(chunk_elems * 4, "attention dP");
  gpu::Buffer p16 = alloc_f16(ctx, chunk_elems, "attention P");
  gpu::Buffer ds16 = alloc_f16(ctx, chunk_elems, "attention dS");
  const auto& softmax_bwd = ctx.pipelines().get(kernels::attn_gemm_softmax_bwd);
  const uint32_t qld = n_heads * head_dim;
  const uint64_t sd = uint64_t(seq) * head_dim;  // batch stride of the [nh, S, d] copies
  for (uint32_t b = 0; b < batch; ++b) {
    pack(ctx, q, b, n_heads, 1, m, q16);
    pack(ctx, k, b, n_kv_heads, m.rep(), m, k16);
    pack(ctx, v, b, n_kv_heads, m.rep(), m, v16);
    pack(ctx, dout, b, n_heads, 1, m, do16);
    const Bound bseg = bind_elements(ctx, segments, uint64_t(b) * seq, seq);
    const Bound blse = bind_elements(ctx, lse, uint64_t(b) * n_heads * seq, uint64_t(n_heads) * seq);
    const Bound bout = bind_elements(ctx, out, b * m.q_seq(), m.q_seq());
    const Bound bdout = bind_elements(ctx, dout, b * m.q_seq(), m.q_seq());
    const uint64_t row0 = uint64_t(b) * seq;  // the sequence's first token
    // The last chunk first: it sees every key, so its dk/dv products initialise all S rows of
    // dk_heads and dv_heads (beta 0) and the earlier chunks add to their prefix (beta 1).
    const uint32_t n_chunks = (seq + C - 1) / C;
    for (uint32_t ci = n_chunks; ci-- > 0;) {
      const uint32_t c0 = ci * C, rows = std::min(C, seq - c0);
      const Chunk c{c0, rows, c0 + rows, round_up8(c0 + rows)};
      const uint64_t elems = uint64_t(n_heads) * rows * c.ldp;
      const uint64_t q_off = (row0 + c0) * qld;
      scores_product(ctx, q16, k16, m, c, scale, scores, o.kernel);
      GemmShape s;  // dP = dout_chunk v^T
      s.m = rows, s.n = c.keys, s.k = head_dim, s.trans_b = true, s.op = "attention_gemm_dp";
      s.batch = n_heads, s.a_stride = sd, s.b_stride = sd, s.c_stride = uint64_t(rows) * c.ldp;
      gemm(ctx, s, {do16, DType::f16, uint64_t(c0) * head_dim, head_dim}, {v16, DType::f16, 0, head_dim},
           {dp, DType::f32, 0, c.ldp}, o.kernel);

      const Bound bsc = bind_elements(ctx, scores, 0, elems);
      const Bound bdp = bind_elements(ctx, dp, 0, elems);
      const Bound bp = bind_elements(ctx, p16, 0, elems / 2);
      const Bound bds = bind_elements(ctx, ds16, 0, elems / 2);
      ctx.dispatch(softmax_bwd,
                   {{bsc.buffer, gpu::Access::read},
                    {bdp.buffer, gpu::Access::read},
                    {bseg.buffer, gpu::Access::read},
                    {blse.buffer, gpu::Access::read},
                    {bout.buffer, gpu::Access::read},
                    {bdout.buffer, gpu::Access::read},
                    {bp.buffer, gpu::Access::write},
                    {bds.buffer, gpu::Access::write}},
                   row_push(m, c, scale, bseg, blse, bout.offset, bdout.offset), rows, n_heads, 1,
                   "attention_gemm_softmax_bwd");

      // dq_chunk = dS k (dS carries the scale).
      GemmShape sq;
      sq.m = rows, sq.n = head_dim, sq.k = c.keys, sq.op = "attention_gemm_dq";
      sq.batch = n_heads, sq.a_stride = uint64_t(rows) * c.ldp, sq.b_stride = sd, sq.c_stride = head_dim;
      gemm(ctx, sq, {ds16, DType::f16, 0, c.ldp}, {k16, DType::f16, 0, head_dim}, {dq, DType::f32, q_off, qld},
           o.kernel);
      // dk_heads[:keys] (+)= dS^T q_chunk; dv_heads[:keys] (+)= P^T dout_chunk.
      GemmShape st;
      st.m = c.keys, st.n = head_dim, st.k = rows, st.trans_a = true, st.beta = ci + 1 == n_chunks ? 0.0f : 1.0f;
      st.op = "attention_gemm_dkdv";
      st.batch = n_heads, st.a_stride = uint64_t(rows) * c.ldp, st.b_stride = sd, st.c_stride = sd;
      gemm(ctx, st, {ds16, DType::f16, 0, c.ldp}, {q16, DType::f16, uint64_t(c0) * head_dim, head_dim},
           {dk_heads, DType::f32, 0, head_dim}, o.kernel);
      gemm(ctx, st, {p16, DType::f16, 0, c.ldp}, {do16, DType::f16, uint64_t(c0) * head_dim, head_dim},
           {dv_heads, DType::f32, 0, head_dim}, o.kernel);
    }
    sum_heads(ctx, dk_heads, b, m, dk);
    sum_heads(ctx, dv_heads, b, m, dv);
  }
  for (const gpu::Buffer& buf : {q16, k16, v16, do16, dk_heads, dv_heads, scores, dp, p16, ds16}) ctx.free(buf);
}

}  // namespace forja::ops
