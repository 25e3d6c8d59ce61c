#include "ops/embedding.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace forja::ops {

namespace {

// Push constants of kernels/embedding.comp.
struct EmbeddingPush {
  uint32_t tokens, hidden, vocab;
  uint32_t row_begin, chunk_rows;              // the table rows bound in this dispatch
  uint32_t first_table, first_ids, first_out;  // element offsets inside the bindings
  uint32_t zero_invalid;
};

uint64_t offset_alignment(const gpu::Context& ctx) {
  return std::max<uint64_t>(16, ctx.info().min_storage_offset_alignment);
}

// A binding that covers bytes [begin, begin + bytes) of `b` from an offset the device accepts;
// `first` is the number of `elem_bytes` elements between the binding's start and `begin`.
struct Window {
  gpu::Buffer view;
  uint32_t first;
};
Window window(const gpu::Context& ctx, const gpu::Buffer& b, uint64_t begin, uint64_t bytes, uint32_t elem_bytes) {
  const uint64_t align = offset_alignment(ctx);
  const uint64_t start = begin / align * align;
  const uint64_t end = std::min<uint64_t>((begin + bytes + 15) / 16 * 16, b.size);
  return {b.slice(start, end - start), static_cast<uint32_t>((begin - start) / elem_bytes)};
}

void check_buffer(const gpu::Context& ctx, const char* name, const gpu::Buffer& b, uint64_t bytes) {
  if (b.size < bytes)
    throw std::logic_error(std::string("embedding_forward: ") + name + " holds " + std::to_string(b.size) +
                           " bytes, the shape needs " + std::to_string(bytes));
  if (b.offset % offset_alignment(ctx) != 0)
    throw std::logic_error(std::string("embedding_forward: ") + name + " starts at offset " + std::to_string(b.offset) +
                           ", not a multiple of the storage-buffer offset alignment");
}

}  // namespace

void embedding_forward(gpu::Context& ctx, const gpu::Buffer& table, DType dtype, const gpu::Buffer& ids,
                       const gpu::Buffer& out, uint32_t tokens, uint32_t hidden, uint32_t vocab) {
  if (tokens == 0) return;
  if (hidden == 0 || vocab == 0) throw std::logic_error("embedding_forward: hidden and vocab must be positive");
  const uint64_t es = dtype_bytes(dtype);
  check_buffer(ctx, "table", table, uint64_t(vocab) * hidden * es);
  check_buffer(ctx, "ids", ids, uint64_t(tokens) * 4);
  check_buffer(ctx, "out", out, uint64_t(tokens) * hidden * 4);
  if (dtype == DType::f16 && !ctx.info().storage_buffer_16bit)
    throw std::logic_error("embedding_forward: an fp16 table needs storageBuffer16BitAccess, which this device lacks");
  // Rows per binding, leaving room for the shift down to an aligned start and the 16-byte
  // round-up of window().
  const uint64_t usable = ctx.info().max_storage_buffer_range - offset_alignment(ctx) - 16;
  const uint64_t table_rows = usable / (hidden * es), token_rows = usable / (uint64_t(hidden) * 4);
  if (table_rows == 0 || token_rows == 0)
    throw std::logic_error("embedding_forward: one row of " + std::to_string(hidden) +
                           " columns exceeds the device's storage-buffer binding limit");
  const auto& p = ctx.pipelines().get(dtype == DType::f16 ? "embedding_f16" : "embedding_f32", 3, sizeof(EmbeddingPush));
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
