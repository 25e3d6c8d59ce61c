#include "ops/embedding.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/kernel_table.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

// Push constants of kernels/embedding.comp.
struct EmbeddingPush {
  uint32_t tokens, hidden, vocab;
  uint32_t row_begin, chunk_rows;              // the table rows bound in this dispatch
  uint32_t first_table, first_ids, first_out;  // element offsets inside the bindings
  uint32_t zero_invalid;
};
static_assert(kernels::push_block_matches<EmbeddingPush>(kernels::embedding_f32, kernels::embedding_f16),
              "EmbeddingPush differs from kernels/embedding.comp's push-constant block");

}  // namespace

void embedding_forward(gpu::Context& ctx, const gpu::Buffer& table, DType dtype, const gpu::Buffer& ids,
                       const gpu::Buffer& out, uint32_t tokens, uint32_t hidden, uint32_t vocab) {
  if (tokens == 0) return;
  if (hidden == 0 || vocab == 0) throw std::logic_error("embedding_forward: hidden and vocab must be positive");
  const uint64_t es = dtype_bytes(dtype);
  check_buffer(ctx, "embedding_forward", "table", table, uint64_t(vocab) * hidden * es);
  check_buffer(ctx, "embedding_forward", "ids", ids, uint64_t(tokens) * 4);
  check_buffer(ctx, "embedding_forward", "out", out, uint64_t(tokens) * hidden * 4);
  if (dtype == DType::f16 && !ctx.info().storage_buffer_16bit)
    throw std::logic_error("embedding_forward: an fp16 table needs storageBuffer16BitAccess, which this device lacks");
  // Rows per binding, leaving room for the shift down to an aligned start and the 16-byte
  // round-up of window().
  const uint64_t usable = usable_binding_bytes(ctx);
  const uint64_t table_rows = usable / (hidden * es), token_rows = usable / (uint64_t(hidden) * 4);
  if (table_rows == 0 || token_rows == 0)
    throw std::logic_error("embedding_forward: one row of " + std::to_string(hidden) +
                           " columns exceeds the device's storage-buffer binding limit");
  const auto& p = ctx.pipelines().get(dtype == DType::f16 ? kernels::embedding_f16 : kernels::embedding_f32);
  for (uint64_t t0 = 0; t0 < tokens; t0 += token_rows) {
    const uint32_t nt = static_cast<uint32_t>(std::min<uint64_t>(token_rows, tokens - t0));
    const Window iw = window(ctx, ids, t0 * 4, uint64_t(nt) * 4, 4);
    const Window ow = window(ctx, out, t0 * hidden * 4, uint64_t(nt) * hidden * 4, 4);
    const uint32_t gx = std::min<uint32_t>(nt, 65535), gy = (nt + gx - 1) / gx;
    for (uint64_t r0 = 0; r0 < vocab; r0 += table_rows) {
      const uint32_t nr = static_cast<uint32_t>(std::min<uint64_t>(table_rows, vocab - r0));
      const Window tw = window(ctx, table, r0 * hidden * es, uint64_t(nr) * hidden * es, static_cast<uint32_t>(es));
      const EmbeddingPush push{nt,       hidden,   vocab,    static_cast<uint32_t>(r0), nr,
                               tw.first, iw.first, ow.first, r0 == 0 ? 1u : 0u};
      ctx.dispatch(p, {{tw.view, gpu::Access::read}, {iw.view, gpu::Access::read}, {ow.view, gpu::Access::write}},
                   push, gx, gy, 1, "embedding_forward");
    }
  }
}

}  // namespace forja::ops
