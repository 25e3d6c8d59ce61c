#include "ops/dropout.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/kernel_table.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

// Push constants of kernels/dropout.comp.
struct DropoutPush {
  uint32_t rows, cols;
  uint32_t first_x, first_y;
  uint32_t row0;
  uint32_t key_lo, key_hi;
  uint32_t threshold;
  float scale;
  uint32_t accumulate;
};
static_assert(kernels::push_block_matches<DropoutPush>(kernels::dropout),
              "DropoutPush differs from kernels/dropout.comp's push-constant block");

constexpr uint32_t kDropoutThreads = 256;
constexpr uint32_t kDropoutMaxGroups = 4096;  // the kernel's grid-stride loop covers the rest

}  // namespace

DropoutParams dropout_params(double p, uint64_t key) {
  if (!(p >= 0.0 && p < 1.0)) throw std::logic_error("dropout_params: p must be in [0, 1), got " + std::to_string(p));
  DropoutParams d;
  d.key = key;
  // p < 1 keeps p * 2^32 below 2^32, so the floor fits 32 bits.
  d.threshold = static_cast<uint32_t>(std::floor(p * 4294967296.0));
  d.scale = static_cast<float>(1.0 / (1.0 - p));
  return d;
}

void dropout_apply(gpu::Context& ctx, const DropoutParams& d, const gpu::Buffer& x, uint64_t x_offset,
                   const gpu::Buffer& y, uint64_t y_offset, uint32_t row0, uint32_t rows, uint32_t cols,
                   bool accumulate) {
  constexpr const char* op = "dropout_apply";
  if (rows == 0 || cols == 0) return;
  const uint64_t n = uint64_t(rows) * cols;
  if (x.size < (x_offset + n) * 4 || y.size < (y_offset + n) * 4)
    throw std::logic_error(std::string(op) + ": buffer smaller than offset + rows x cols");
  if (uint64_t(row0) + rows > UINT32_MAX) throw std::logic_error(std::string(op) + ": row index beyond 32 bits");
  const uint64_t usable = usable_binding_bytes(ctx);
  const uint64_t chunk_rows = std::min<uint64_t>(usable / (uint64_t(cols) * 4), UINT32_MAX);
  if (chunk_rows == 0) throw std::logic_error(std::string(op) + ": one row exceeds the storage-buffer binding limit");
  const auto& p = ctx.pipelines().get(kernels::dropout);
  for (uint32_t r0 = 0; r0 < rows;) {
    const uint32_t nr = static_cast<uint32_t>(std::min<uint64_t>(chunk_rows, rows - r0));
    const uint64_t len = uint64_t(nr) * cols * 4;
    const Window xw = window(ctx, x, (x_offset + uint64_t(r0) * cols) * 4, len);
    const Window yw = window(ctx, y, (y_offset + uint64_t(r0) * cols) * 4, len);
    const DropoutPush push{nr,
                           cols,
                           xw.first,
                           yw.first,
                           row0 + r0,
                           static_cast<uint32_t>(d.key),
                           static_cast<uint32_t>(d.key >> 32),
                           d.threshold,
                           d.scale,
                           accumulate ? 1u : 0u};
    const uint64_t elems = uint64_t(nr) * cols;
    const uint32_t groups = static_cast<uint32_t>(std::min<uint64_t>((elems + kDropoutThreads - 1) / kDropoutThreads, kDropoutMaxGroups));
    ctx.dispatch(p, {{xw.view, gpu::Access::read}, {yw.view, accumulate ? gpu::Access::read_write : gpu::Access::write}},
                 push, groups, 1, 1, op, double(elems));
    r0 += nr;
  }
}

}  // namespace forja::ops
