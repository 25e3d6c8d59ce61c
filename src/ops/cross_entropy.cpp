#include "ops/cross_entropy.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/kernel_table.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

// Must match PC in kernels/cross_entropy.comp.
struct CePush {
  uint32_t rows, cols, v0, first, tgt_off, tb, vocab, n, x_off;
};
static_assert(kernels::push_block_matches<CePush>(kernels::ce_stats, kernels::ce_loss, kernels::ce_grad, kernels::ce_grad_f16, kernels::ce_to_f16),
              "CePush differs from kernels/cross_entropy.comp's push-constant block");

constexpr uint32_t kCeThreads = 256;
constexpr uint32_t kCeMaxGroups = 4096;  // grid-stride loops cover the rest
// Cap on the [Tb, Vc] logits scratch: 1024 rows of an 8192-wide chunk, GEMMs of
// 1024 x 8192 x H, large enough to fill a big GPU, small next to the model's activations.
constexpr uint64_t kMaxLogitsBytes = 32ull << 20;

void ce_check_buffer(const char* name, const gpu::Buffer& b, uint64_t bytes) {
  if (b.size < bytes)
    throw std::invalid_argument(std::string("lm_head_cross_entropy: buffer '") + name + "' has " +
                                std::to_string(b.size) + " bytes, the shape needs " + std::to_string(bytes));
}

// Row block: the logits chunk, and the x rows that ce_to_f16 binds, stay under the binding
// limit (and the logits under kMaxLogitsBytes); one workgroup per row in ce_stats.
uint32_t rows_per_block(uint64_t tokens, uint64_t hidden, uint32_t vc, uint64_t max_binding) {
  const uint64_t cap = std::min<uint64_t>(max_binding, kMaxLogitsBytes);
  const uint64_t row_bytes = std::max<uint64_t>(vc, hidden) * 4;
  if (row_bytes > cap)
    throw std::invalid_argument("lm_head_cross_entropy: one row of " + std::to_string(row_bytes) +
                                " bytes exceeds the binding limit; lower vocab_chunk");
  return static_cast<uint32_t>(std::min<uint64_t>({tokens, cap / row_bytes, 65535}));
}

uint32_t ce_grid(uint64_t n) {
  return static_cast<uint32_t>(std::clamp<uint64_t>((n + kCeThreads - 1) / kCeThreads, 1, kCeMaxGroups));
}

}  // namespace

void lm_head_cross_entropy(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, DType w_dtype,
                           const gpu::Buffer& targets, uint32_t tokens, uint32_t hidden, uint32_t vocab, float inv_n,
                           const gpu::Buffer& loss_sum, const gpu::Buffer& dx, const CrossEntropyOptions& options) {
  if (tokens == 0) return;
  if (hidden == 0 || vocab == 0 || options.vocab_chunk == 0)
    throw std::invalid_argument("lm_head_cross_entropy: hidden, vocab and vocab_chunk must be positive");
  const uint64_t T = tokens, H = hidden, V = vocab;
  ce_check_buffer("x", x, T * H * 4);
  ce_check_buffer("w", w, V * H * dtype_bytes(w_dtype));
  ce_check_buffer("targets", targets, T * 4);
  ce_check_buffer("loss_sum", loss_sum, 4);
  if (options.need_grad) ce_check_buffer("dx", dx, T * H * 4);

  const bool f16 = w_dtype == DType::f16;
  const uint32_t vc = std::min(options.vocab_chunk, vocab);
  const uint64_t slack = std::max<uint64_t>(256, ctx.info().min_storage_offset_alignment);
  const uint32_t tb = rows_per_block(tokens, hidden, vc, ctx.info().max_storage_buffer_range - slack);

  gpu::Buffer logits = ctx.alloc(uint64_t(tb) * vc * 4, "cross-entropy logits chunk");  // [Tb, Vc]
  gpu::Buffer stats = ctx.alloc(uint64_t(tb) * 4 * 4, "cross-entropy row statistics");  // m, s, tl, lse [Tb]
  gpu::Buffer x_h, dlogits_h;  // fp16 [Tb, H], [Tb, Vc] (fp16 W only)
  if (f16) {
    x_h = ctx.alloc((uint64_t(tb) * H * 2 + 3) / 4 * 4, "cross-entropy x fp16");
    if (options.need_grad) dlogits_h = ctx.alloc((uint64_t(tb) * vc * 2 + 3) / 4 * 4, "cross-entropy dlogits fp16");
  }
  const auto& p_stats = ctx.pipelines().get(kernels::ce_stats);
  const auto& p_loss = ctx.pipelines().get(kernels::ce_loss);

  for (uint64_t r0 = 0; r0 < T; r0 += tb) {
    const uint32_t rows = static_cast<uint32_t>(std::min<uint64_t>(tb, T - r0));
    const Bound bt = bind_elements(ctx, targets, r0, rows);
    MatrixView xa{x, DType::f32, r0 * H, hidden};
    if (f16) {
      const Bound bx = bind_elements(ctx, x, r0 * H, rows * H);
      const uint32_t n = static_cast<uint32_t>(rows * H);
      const auto& p = ctx.pipelines().get(kernels::ce_to_f16);
      ctx.dispatch(p, {{bx.buffer, gpu::Access::read}, {x_h, gpu::Access::write}},
                   CePush{0, 0, 0, 0, 0, 0, 0, n, bx.offset}, ce_grid((n + 1) / 2), 1, 1, "ce_to_f16");
      xa = {x_h, DType::f16, 0, hidden};
    }
    // logits [rows, vcur] = x_rows W[v0 : v0 + vcur]^T
    auto chunk_logits = [&](uint32_t v0, uint32_t vcur) {
      GemmShape s;
      s.m = rows;
      s.n = vcur;
      s.k = hidden;
      s.trans_b = true;
      gemm(ctx, s, xa, {w, w_dtype, uint64_t(v0) * H, hidden}, {logits, DType::f32, 0, vcur});
    };

    for (uint32_t v0 = 0; v0 < vocab; v0 += vc) {
      const uint32_t vcur = std::min(vc, vocab - v0);
      chunk_logits(v0, vcur);
      ctx.dispatch(p_stats,
                   {{logits.slice(0, uint64_t(rows) * vcur * 4), gpu::Access::read},
                    {bt.buffer, gpu::Access::read},
                    {stats, gpu::Access::read_write}},
                   CePush{rows, vcur, v0, v0 == 0 ? 1u : 0u, bt.offset, tb, vocab, 0, 0}, rows, 1, 1, "ce_stats");
    }
    ctx.dispatch(
        p_loss, {{bt.buffer, gpu::Access::read}, {stats, gpu::Access::read_write}, {loss_sum, gpu::Access::read_write}},
        CePush{rows, 0, 0, 0, bt.offset, tb, vocab, 0, 0}, 1, 1, 1, "ce_loss");
    if (!options.need_grad) continue;

    for (uint32_t v0 = 0; v0 < vocab; v0 += vc) {
      const uint32_t vcur = std::min(vc, vocab - v0);
      chunk_logits(v0, vcur);
      const uint32_t n = rows * vcur;
      const gpu::Buffer lg = logits.slice(0, uint64_t(n) * 4);
      const CePush push{rows, vcur, v0, 0, bt.offset, tb, vocab, n, 0};
      MatrixView da{logits, DType::f32, 0, vcur};
      if (f16) {
        const auto& p = ctx.pipelines().get(kernels::ce_grad_f16);
        ctx.dispatch(p,
                     {{lg, gpu::Access::read},
                      {bt.buffer, gpu::Access::read},
                      {stats, gpu::Access::read},
                      {dlogits_h, gpu::Access::write}},
                     push, ce_grid((n + 1) / 2), 1, 1, "ce_grad");
        da = {dlogits_h, DType::f16, 0, vcur};
      } else {
        const auto& p = ctx.pipelines().get(kernels::ce_grad);
        ctx.dispatch(p, {{lg, gpu::Access::read_write}, {bt.buffer, gpu::Access::read}, {stats, gpu::Access::read}},
                     push, ce_grid(n), 1, 1, "ce_grad");
      }
      // dx_rows (+)= inv_n dlogits W[v0 : v0 + vcur]: [rows, vcur] x [vcur, H]
      GemmShape s;
      s.m = rows;
      s.n = hidden;
      s.k = vcur;
      s.alpha = inv_n;
      s.beta = v0 == 0 ? 0.0f : 1.0f;
      gemm(ctx, s, da, {w, w_dtype, uint64_t(v0) * H, hidden}, {dx, DType::f32, r0 * H, hidden});
    }
  }
  ctx.free(logits);
  ctx.free(stats);
  if (f16) {
    ctx.free(x_h);
    if (options.need_grad) ctx.free(dlogits_h);
  }
}

uint64_t lm_head_cross_entropy_scratch_bytes(uint32_t tokens, uint32_t hidden, uint32_t vocab, bool f16_weights,
                                             uint64_t max_binding_bytes, const CrossEntropyOptions& options) {
  if (tokens == 0 || hidden == 0 || vocab == 0 || options.vocab_chunk == 0) return 0;
  const uint32_t vc = std::min(options.vocab_chunk, vocab);
  const uint64_t tb = rows_per_block(tokens, hidden, vc, max_binding_bytes), H = hidden;
  uint64_t bytes = tb * vc * 4 + tb * 16;
  if (f16_weights) bytes += tb * H * 2 + (options.need_grad ? tb * vc * 2 : 0);
  if (options.need_grad) {
    // dx rows += dlogits W chunk: [tb, vc] x [vc, H], split along K where the GEMM does so.
    GemmShape s;
    s.m = static_cast<uint32_t>(tb), s.n = hidden, s.k = vc;
    const uint32_t slices = gemm_split_k_slices(s);
    if (slices > 1) {
      const uint64_t step = ((vc + slices - 1) / slices + 15) / 16 * 16;
      bytes += (vc + step - 1) / step * tb * H * 4;
    }
  }
  return bytes;
}

}  // namespace forja::ops
