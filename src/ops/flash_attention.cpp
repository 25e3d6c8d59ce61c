#include "ops/flash_attention.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpu/pipeline.h"
#include "kernels/kernel_table.h"
#include "ops/attention_common.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

// Must match PC in kernels/flash_attention.comp.
struct FlashPush {
  uint32_t seq, n_heads, n_kv_heads, head_dim;
  float scale;
  uint32_t off[9];  // element offsets, in binding order
  uint32_t parts;   // the dk/dv kernel's split of a kv head's query heads
};
static_assert(kernels::push_block_matches<FlashPush>(
                  kernels::flash_fwd_nvcm, kernels::flash_fwd_emu, kernels::flash_fwd_f32, kernels::flash_bwd_dq_nvcm,
                  kernels::flash_bwd_dq_emu, kernels::flash_bwd_dq_f32, kernels::flash_bwd_dkdv_nvcm,
                  kernels::flash_bwd_dkdv_emu, kernels::flash_bwd_dkdv_f32, kernels::flash_sum_parts),
              "FlashPush differs from kernels/flash_attention.comp's push-constant block");

enum class Pass { fwd, dq, dkdv };

struct Tile {
  uint32_t q, k;
};

// Candidates per kernel, best first (the coopmat kernels on a 48 KiB device take the first that
// fits at head_dim 128; lavapipe's 32 KiB takes smaller ones).
const std::vector<Tile>& candidates(Pass p) {
  static const std::vector<Tile> fwd{{64, 64}, {64, 32}, {32, 32}, {32, 16}, {16, 16}};
  static const std::vector<Tile> dq{{64, 32}, {32, 32}, {32, 16}, {16, 16}};
  static const std::vector<Tile> dkdv{{32, 64}, {32, 32}, {32, 16}, {16, 32}, {16, 16}};
  return p == Pass::fwd ? fwd : p == Pass::dq ? dq : dkdv;
}

// Shared memory of a kernel with tile t: the same arithmetic as the kernel's layout.
uint64_t shared_bytes(Pass p, Tile t, uint32_t hd, bool f32) {
  const uint64_t epu = f32 ? 4 : 8;  // operand elements per 16 bytes
  const uint64_t ldh = hd + epu;
  const uint64_t q_tile = t.q * ldh / epu * 16, kv_tile = t.k * ldh / epu * 16;
  const uint64_t small = 4 * (t.q + t.k) + 8;  // segment ids and flags
  switch (p) {
    case Pass::fwd: {
      const uint64_t scores = uint64_t(t.q) * (t.k + 4) * 4;
      const uint64_t scratch = t.q / 16 * 1024;
      return q_tile + 2 * kv_tile + scores + (kv_tile >= scratch ? 0 : scratch) + small + 3 * 4 * t.q;
    }
    case Pass::dq:
      return 2 * q_tile + 2 * kv_tile + t.q * (t.k + epu) / epu * 16 + t.q / 16 * 2048 + small + 2 * 4 * t.q +
             4 * (2 * t.q);
    case Pass::dkdv:
      return 2 * kv_tile + 2 * q_tile + 2 * (t.k * (t.q + epu) / epu * 16) + t.k / 16 * 2048 + small + 2 * 4 * t.q;
  }
  return 0;
}

const kernels::Kernel& kernel_of(Pass p, FlashKernel k) {
  static const kernels::Kernel* table[3][3] = {
      {&kernels::flash_fwd_nvcm, &kernels::flash_fwd_emu, &kernels::flash_fwd_f32},
      {&kernels::flash_bwd_dq_nvcm, &kernels::flash_bwd_dq_emu, &kernels::flash_bwd_dq_f32},
      {&kernels::flash_bwd_dkdv_nvcm, &kernels::flash_bwd_dkdv_emu, &kernels::flash_bwd_dkdv_f32}};
  const int v = k == FlashKernel::coopmat ? 0 : k == FlashKernel::coopmat_emulated ? 1 : 2;
  return *table[static_cast<int>(p)][v];
}

// The tile of pass p, or {0, 0} with `why` set.
Tile pick(const gpu::Context& ctx, Pass p, uint32_t hd, FlashKernel kernel, const FlashAttentionOptions& o,
          std::string& why) {
  const uint64_t limit = ctx.info().max_shared_memory;
  const bool f32 = kernel == FlashKernel::f32;
  if (o.block_q != 0 || o.block_k != 0) {
    const Tile t{o.block_q, o.block_k};
    if (t.q == 0 || t.k == 0 || t.q % 16 != 0 || t.k % 16 != 0 || t.q > 128 || t.k > 128) {
      why = "tiles " + std::to_string(t.q) + "x" + std::to_string(t.k) + " are not multiples of 16 up to 128";
      return {0, 0};
    }
    const uint64_t bytes = shared_bytes(p, t, hd, f32);
    if (bytes > limit) {
      why = std::string(kernel_of(p, kernel).name) + " with tiles " + std::to_string(t.q) + "x" + std::to_string(t.k) +
            " needs " + std::to_string(bytes) + " bytes of shared memory, the device has " + std::to_string(limit);
      return {0, 0};
    }
    return t;
  }
  for (const Tile& t : candidates(p))
    if (shared_bytes(p, t, hd, f32) <= limit) return t;
  why = std::string(kernel_of(p, kernel).name) + " at head_dim " + std::to_string(hd) + " needs " +
        std::to_string(shared_bytes(p, candidates(p).back(), hd, f32)) +
        " bytes of shared memory even with 16x16 tiles, the device has " + std::to_string(limit);
  return {0, 0};
}

// The kernels' HD: head_dim rounded up to whole 16-wide fragments (zero columns past it).
uint32_t padded_head_dim(uint32_t d) { return (d + 15) / 16 * 16; }

// Empty when supported, else the reason.
std::string unsupported(const gpu::Context& ctx, uint32_t hd, const FlashAttentionOptions& o, FlashTiles* tiles) {
  if (hd == 0 || hd > 128) return "head_dim " + std::to_string(hd) + " is outside 1..128";
  hd = padded_head_dim(hd);
  const FlashKernel kernel = flash_kernel_for(ctx, o.kernel);
  if (kernel == FlashKernel::coopmat && !flash_attention_coopmat_available(ctx))
    return "the cooperative-matrix kernels are not available on this device (or FORJA_NO_COOPMAT is set)";
  std::string why;
  const Tile f = pick(ctx, Pass::fwd, hd, kernel, o, why);
  if (f.q == 0) return why;
  const Tile dq = pick(ctx, Pass::dq, hd, kernel, o, why);
  if (dq.q == 0) return why;
  const Tile kv = pick(ctx, Pass::dkdv, hd, kernel, o, why);
  if (kv.q == 0) return why;
  if (tiles) *tiles = {f.q, f.k, dq.q, dq.k, kv.q, kv.k};
  return {};
}

using Dims = AttentionDims;

const gpu::Pipeline& pipeline(gpu::Context& ctx, Pass p, FlashKernel kernel, Tile t, uint32_t hd) {
  const uint32_t threads = (p == Pass::dkdv ? t.k : t.q) / 16 * 32;
  return ctx.pipelines().get(kernel_of(p, kernel), {threads, t.q, t.k, padded_head_dim(hd)});
}

}  // namespace

bool flash_attention_coopmat_available(const gpu::Context& ctx) {
  return ctx.info().nv_coopmat_f16_f32_16x16x16 && kernels::flash_fwd_nvcm.built &&
         !gpu::env_flag("FORJA_NO_COOPMAT");
}

FlashKernel flash_kernel_for(const gpu::Context& ctx, FlashKernel requested) {
  if (requested != FlashKernel::automatic) return requested;
  return flash_attention_coopmat_available(ctx) ? FlashKernel::coopmat : FlashKernel::coopmat_emulated;
}

std::string flash_kernel_name(FlashKernel k) {
  switch (k) {
    case FlashKernel::automatic: return "automatic";
    case FlashKernel::coopmat: return "coopmat";
    case FlashKernel::coopmat_emulated: return "coopmat-emulated";
    case FlashKernel::f32: return "f32";
  }
  return "?";
}

bool flash_attention_supports(const gpu::Context& ctx, uint32_t head_dim, const FlashAttentionOptions& options) {
  return unsupported(ctx, head_dim, options, nullptr).empty();
}

uint32_t flash_attention_dkdv_split(const gpu::Context& ctx, uint32_t batch, uint32_t seq, uint32_t n_heads,
                                    uint32_t n_kv_heads, uint32_t head_dim, const FlashAttentionOptions& o) {
  const uint32_t rep = n_kv_heads ? n_heads / n_kv_heads : 1;
  if (o.dkdv_head_split != 0) {
    if (rep % o.dkdv_head_split != 0)
      throw std::invalid_argument("flash attention: dkdv_head_split " + std::to_string(o.dkdv_head_split) +
                                  " does not divide the " + std::to_string(rep) + " query heads per kv head");
    return o.dkdv_head_split;
  }
  const uint32_t cu = ctx.info().compute_units;
  if (cu == 0) return 1;
  const uint32_t bc = flash_attention_tiles(ctx, head_dim, o).dkdv_k;
  const uint64_t groups = uint64_t((seq + bc - 1) / bc) * n_kv_heads * batch;
  for (uint32_t p = 1; p < rep; ++p)
    if (rep % p == 0 && groups * p >= 8ull * cu) return p;
  return rep;
}

FlashTiles flash_attention_tiles(const gpu::Context& ctx, uint32_t head_dim, const FlashAttentionOptions& options) {
  FlashTiles t;
  const std::string why = unsupported(ctx, head_dim, options, &t);
  if (!why.empty()) throw std::invalid_argument("flash attention: " + why);
  return t;
}

void flash_attention_forward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                             const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                             uint32_t batch, uint32_t seq, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                             float scale, const FlashAttentionOptions& o) {
  const char* op = "flash_attention_forward";
  const Dims m{batch, seq, n_heads, n_kv_heads, head_dim};
  check_attention_heads(op, m);
  const FlashTiles tiles = flash_attention_tiles(ctx, head_dim, o);
  if (batch == 0 || seq == 0) return;
  check_attention_operands(op, m, q, k, v, segments, out, lse);

  const FlashKernel kernel = flash_kernel_for(ctx, o.kernel);
  const Tile t{tiles.fwd_q, tiles.fwd_k};
  const auto& p = pipeline(ctx, Pass::fwd, kernel, t, head_dim);
  const uint32_t per = sequences_per_dispatch(ctx, op, m);
  for (uint32_t b0 = 0; b0 < batch; b0 += per) {
    const uint32_t nb = std::min(per, batch - b0);
    const auto [bq, bk, bv, bs, bo, bl] = bind_attention(ctx, m, b0, nb, q, k, v, segments, out, lse);
    const FlashPush push{seq, n_heads, n_kv_heads, head_dim, scale,
                         {bq.offset, bk.offset, bv.offset, bs.offset, bo.offset, bl.offset, 0, 0, 0},
                         1};
    // Causal: about half of the S x S scores, each a d-long dot in QK^T and in PV.
    const double flops = 2.0 * 2.0 * nb * n_heads * (0.5 * seq * (seq + 1.0)) * head_dim;
    ctx.dispatch(p,
                 {{bq.buffer, gpu::Access::read},
                  {bk.buffer, gpu::Access::read},
                  {bv.buffer, gpu::Access::read},
                  {bs.buffer, gpu::Access::read},
                  {bo.buffer, gpu::Access::write},
                  {bl.buffer, gpu::Access::write}},
                 push, (seq + t.q - 1) / t.q, n_heads, nb, op, flops);
  }
}

void flash_attention_backward(gpu::Context& ctx, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                              const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                              const gpu::Buffer& dout, const gpu::Buffer& dq, const gpu::Buffer& dk,
                              const gpu::Buffer& dv, uint32_t batch, uint32_t seq, uint32_t n_heads,
                              uint32_t n_kv_heads, uint32_t head_dim, float scale, const FlashAttentionOptions& o) {
  const char* op = "flash_attention_backward";
  const Dims m{batch, seq, n_heads, n_kv_heads, head_dim};
  check_attention_heads(op, m);
  const FlashTiles tiles = flash_attention_tiles(ctx, head_dim, o);
  if (batch == 0 || seq == 0) return;
  check_attention_operands(op, m, q, k, v, segments, out, lse);
  check_attention_gradients(op, m, dout, dq, dk, dv);

  const FlashKernel kernel = flash_kernel_for(ctx, o.kernel);
  const Tile tq{tiles.dq_q, tiles.dq_k}, tkv{tiles.dkdv_q, tiles.dkdv_k};
  const auto& pdq = pipeline(ctx, Pass::dq, kernel, tq, head_dim);
  const auto& pkv = pipeline(ctx, Pass::dkdv, kernel, tkv, head_dim);
  // D_i = dout_i . out_i per (sequence, head, query), written by the dq kernel, read by dkdv.
  gpu::Buffer drow = ctx.alloc(m.stat_seq() * batch * 4, "flash attention D");
  const uint32_t per = sequences_per_dispatch(ctx, op, m);
  // With a head split, partial dk and dv [B*S, nkv * parts, d] for one dispatch's sequences (no
  // larger per sequence than q, so within the binding limit sequences_per_dispatch checked).
  const uint32_t parts = flash_attention_dkdv_split(ctx, batch, seq, n_heads, n_kv_heads, head_dim, o);
  const uint64_t part_seq = m.kv_seq() * parts;
  gpu::Buffer dk_parts, dv_parts;
  if (parts > 1) {
    dk_parts = ctx.alloc(part_seq * std::min(per, batch) * 4, "flash attention partial dk");
    dv_parts = ctx.alloc(part_seq * std::min(per, batch) * 4, "flash attention partial dv");
  }
  for (uint32_t b0 = 0; b0 < batch; b0 += per) {
    const uint32_t nb = std::min(per, batch - b0);
    const AttentionBindings f = bind_attention(ctx, m, b0, nb, q, k, v, segments, out, lse);
    const AttentionGradBindings g = bind_attention_grads(ctx, m, b0, nb, dout, dq, dk, dv, drow);
    // FLOPs: dq recomputes S and dP and forms dS K (3 causal-half products); dkdv recomputes
    // both again and forms P^T dout and dS^T q (4).
    const double product = 2.0 * nb * n_heads * (0.5 * seq * (seq + 1.0)) * head_dim;

    const BackwardKernelArgs dq_args = dq_kernel_args(f, g);
    FlashPush push_dq{seq, n_heads, n_kv_heads, head_dim, scale, {}, 1};
    std::copy(dq_args.offsets.begin(), dq_args.offsets.end(), push_dq.off);
    ctx.dispatch(pdq, dq_args.bindings, push_dq, (seq + tq.q - 1) / tq.q, n_heads, nb, "flash_attention_backward_dq",
                 3 * product);

    const Bound bdk_out = parts > 1 ? bind_elements(ctx, dk_parts, 0, nb * part_seq) : g.dk;
    const Bound bdv_out = parts > 1 ? bind_elements(ctx, dv_parts, 0, nb * part_seq) : g.dv;
    const BackwardKernelArgs kv_args = dkdv_kernel_args(f, g, bdk_out, bdv_out);
    FlashPush push_kv{seq, n_heads, n_kv_heads, head_dim, scale, {}, parts};
    std::copy(kv_args.offsets.begin(), kv_args.offsets.end(), push_kv.off);
    ctx.dispatch(pkv, kv_args.bindings, push_kv, (seq + tkv.k - 1) / tkv.k, n_kv_heads * parts, nb,
                 "flash_attention_backward_dkdv", 4 * product);
    if (parts > 1) {
      const uint64_t count = nb * m.kv_seq();
      const uint32_t groups = static_cast<uint32_t>(std::clamp<uint64_t>((count + 255) / 256, 1, 65535));
      const auto& psum = ctx.pipelines().get(kernels::flash_sum_parts, {256});
      for (const auto& [src, dst] : {std::pair{bdk_out, g.dk}, std::pair{bdv_out, g.dv}}) {
        const FlashPush push_sum{nb * seq, n_heads, n_kv_heads, head_dim, scale, {src.offset, dst.offset}, parts};
        ctx.dispatch(psum, {{src.buffer, gpu::Access::read}, {dst.buffer, gpu::Access::write}}, push_sum, groups, 1, 1,
                     "flash_attention_sum_parts");
      }
    }
  }
  ctx.free(drow);
  if (parts > 1) {
    ctx.free(dk_parts);
    ctx.free(dv_parts);
  }
}

}  // namespace forja::ops
