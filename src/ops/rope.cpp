#include "ops/rope.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernel_table.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

// Push constants of kernels/rope.comp.
struct RopePush {
  uint32_t tokens, heads, half_dim;
  uint32_t first_x, first_pos;  // element offsets of the chunk's first token inside the bindings
  float sign;
};
static_assert(kernels::push_block_matches<RopePush>(kernels::rope),
              "RopePush differs from kernels/rope.comp's push-constant block");

constexpr uint32_t kRopeThreads = 256;
constexpr uint32_t kRopeMaxGroups = 65535;  // the kernel's grid-stride loop covers the rest

void rope_apply(gpu::Context& ctx, const char* op, float sign, const gpu::Buffer& x, const gpu::Buffer& positions,
                const gpu::Buffer& inv_freq, uint32_t tokens, uint32_t heads, uint32_t head_dim) {
  if (tokens == 0 || heads == 0) return;
  if (head_dim == 0 || head_dim % 2 != 0)
    throw std::logic_error(std::string(op) + ": head_dim " + std::to_string(head_dim) + " must be even and positive");
  const uint64_t row_bytes = uint64_t(heads) * head_dim * 4;  // one token
  check_buffer(ctx, op, "x", x, tokens * row_bytes);
  check_buffer(ctx, op, "positions", positions, uint64_t(tokens) * 4);
  check_buffer(ctx, op, "inv_freq", inv_freq, uint64_t(head_dim / 2) * 4);
  const uint64_t usable = usable_binding_bytes(ctx);
  const uint64_t chunk = std::min<uint64_t>(usable / row_bytes, UINT32_MAX / head_dim);
  if (chunk == 0)
    throw std::logic_error(std::string(op) + ": one token of " + std::to_string(heads) + " heads x " +
                           std::to_string(head_dim) + " exceeds the device's storage-buffer binding limit");
  const auto& p = ctx.pipelines().get(kernels::rope);
  const gpu::Buffer freq = inv_freq.slice(0, std::min<uint64_t>(inv_freq.size, (uint64_t(head_dim / 2) * 4 + 15) / 16 * 16));
  for (uint64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(chunk, tokens - t0));
    const Window xw = window(ctx, x, t0 * row_bytes, n * row_bytes);
    const Window pw = window(ctx, positions, t0 * 4, uint64_t(n) * 4);
    const RopePush push{n, heads, head_dim / 2, xw.first, pw.first, sign};
    const uint64_t pairs = uint64_t(n) * (head_dim / 2);
    const uint32_t groups = static_cast<uint32_t>(std::min<uint64_t>((pairs + kRopeThreads - 1) / kRopeThreads, kRopeMaxGroups));
    ctx.dispatch(p, {{xw.view, gpu::Access::read_write}, {pw.view, gpu::Access::read}, {freq, gpu::Access::read}}, push,
                 groups, 1, 1, op, 6.0 * double(n) * heads * head_dim / 2);
  }
}

}  // namespace

void rope_forward(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& positions, const gpu::Buffer& inv_freq,
                  uint32_t tokens, uint32_t heads, uint32_t head_dim) {
  rope_apply(ctx, "rope_forward", 1.0f, x, positions, inv_freq, tokens, heads, head_dim);
}

void rope_backward(gpu::Context& ctx, const gpu::Buffer& dx, const gpu::Buffer& positions, const gpu::Buffer& inv_freq,
                   uint32_t tokens, uint32_t heads, uint32_t head_dim) {
  rope_apply(ctx, "rope_backward", -1.0f, dx, positions, inv_freq, tokens, heads, head_dim);
}

namespace {

// Push constants of kernels/qk_norm_rope.comp.
struct QkNormRopePush {
  uint32_t rows, heads, head_dim, first_x, first_out, first_r, first_pos;
  float eps;
  uint32_t ld_out, first_dy;
};
static_assert(kernels::push_block_matches<QkNormRopePush>(kernels::qk_norm_rope_f16, kernels::qk_norm_rope_bwd_f16));

// The forward (dy invalid) or the backward of Qwen3's q/k norm with RoPE, fp16 out with rows of
// out_ld halves, in token chunks within the binding limit.
void qk_norm_rope(gpu::Context& ctx, const char* op, const gpu::Buffer& x, const gpu::Buffer& dy, const gpu::Buffer& w,
                  const gpu::Buffer& out, uint32_t out_ld, const gpu::Buffer& rstd, const gpu::Buffer& positions,
                  const gpu::Buffer& inv_freq, uint32_t tokens, uint32_t heads, uint32_t head_dim, float eps) {
  if (tokens == 0 || heads == 0) return;
  if (head_dim == 0 || head_dim % 4 != 0)
    throw std::logic_error(std::string(op) + ": head_dim " + std::to_string(head_dim) + " must be a multiple of 4");
  if (out_ld % 2 != 0 || out_ld < uint64_t(heads) * head_dim)
    throw std::logic_error(std::string(op) + ": out's rows of " + std::to_string(out_ld) +
                           " halves must be even and hold a token's heads");
  const bool backward = dy.valid();
  const uint64_t rows = uint64_t(tokens) * heads, row_bytes = uint64_t(heads) * head_dim * 4;  // one token, fp32
  const uint64_t out_row = uint64_t(out_ld) * 2;
  check_buffer(ctx, op, "x", x, tokens * row_bytes);
  if (backward) check_buffer(ctx, op, "dy", dy, tokens * row_bytes);
  check_buffer(ctx, op, "out", out, (tokens - 1) * out_row + row_bytes / 2);
  check_buffer(ctx, op, "rstd", rstd, rows * 4);
  check_buffer(ctx, op, "w", w, uint64_t(head_dim) * 4);
  check_buffer(ctx, op, "positions", positions, uint64_t(tokens) * 4);
  check_buffer(ctx, op, "inv_freq", inv_freq, uint64_t(head_dim / 2) * 4);
  // Invocations per row: up to 32, one pair of column pairs each per pass (no idle ones where
  // head_dim / 4 is smaller); workgroups of 256 on a GPU, of two rows' lanes (at least 32) on a
  // CPU, where every barrier is a pass over the workgroup (as rmsnorm.cpp).
  uint32_t lanes = 1;
  while (lanes < 32 && lanes * 2 <= head_dim / 4) lanes *= 2;
  const uint32_t wg = ctx.info().is_cpu() ? std::max(2 * lanes, 32u) : 256;
  const uint32_t rows_per_group = wg / lanes;
  const auto& p = ctx.pipelines().get(backward ? kernels::qk_norm_rope_bwd_f16 : kernels::qk_norm_rope_f16, {wg, lanes});
  const uint64_t widest = std::max(row_bytes, out_row);
  const uint64_t chunk = std::min<uint64_t>(usable_binding_bytes(ctx) / widest, (1ull << 31) / widest);
  if (chunk == 0) throw std::logic_error(std::string(op) + ": one token exceeds the device's binding limit");
  const gpu::Buffer wv = w.slice(0, std::min<uint64_t>(w.size, (uint64_t(head_dim) * 4 + 15) / 16 * 16));
  const gpu::Buffer freq = inv_freq.slice(0, std::min<uint64_t>(inv_freq.size, (uint64_t(head_dim / 2) * 4 + 15) / 16 * 16));
  for (uint64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(chunk, tokens - t0));
    const uint32_t nrows = n * heads;
    const Window xw = window(ctx, x, t0 * row_bytes, n * row_bytes);
    const Window ow = window(ctx, out, t0 * out_row, (n - 1) * out_row + row_bytes / 2, 2);
    const Window rw = window(ctx, rstd, t0 * heads * 4, uint64_t(nrows) * 4);
    const Window pw = window(ctx, positions, t0 * 4, uint64_t(n) * 4);
    const uint32_t groups = (nrows + rows_per_group - 1) / rows_per_group;
    const uint32_t gx = std::min<uint32_t>(groups, 65535), gy = (groups + gx - 1) / gx;
    std::vector<gpu::Binding> bindings = {{xw.view, gpu::Access::read},
                                          {wv, gpu::Access::read},
                                          {ow.view, gpu::Access::write},
                                          {rw.view, backward ? gpu::Access::read : gpu::Access::write},
                                          {pw.view, gpu::Access::read},
                                          {freq, gpu::Access::read}};
    uint32_t first_dy = 0;
    if (backward) {
      const Window dw = window(ctx, dy, t0 * row_bytes, n * row_bytes);
      bindings.push_back({dw.view, gpu::Access::read});
      first_dy = dw.first;
    }
    ctx.dispatch(p, bindings,
                 QkNormRopePush{nrows, heads, head_dim, xw.first, ow.first, rw.first, pw.first, eps, out_ld, first_dy},
                 gx, gy, 1, backward ? "qk_norm_rope_backward" : "qk_norm_rope", 10.0 * double(nrows) * head_dim);
  }
}

}  // namespace

void qk_norm_rope_f16(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, const gpu::Buffer& out,
                      const gpu::Buffer& rstd, const gpu::Buffer& positions, const gpu::Buffer& inv_freq,
                      uint32_t tokens, uint32_t heads, uint32_t head_dim, float eps) {
  qk_norm_rope(ctx, "qk_norm_rope_f16", x, gpu::Buffer{}, w, out, heads * head_dim, rstd, positions, inv_freq, tokens,
               heads, head_dim, eps);
}

void qk_norm_rope_backward_f16(gpu::Context& ctx, const gpu::Buffer& dy, const gpu::Buffer& x, const gpu::Buffer& w,
                               const gpu::Buffer& rstd, const gpu::Buffer& positions, const gpu::Buffer& inv_freq,
                               const gpu::Buffer& out, uint32_t out_ld, uint32_t tokens, uint32_t heads,
                               uint32_t head_dim) {
  if (!dy.valid()) throw std::logic_error("qk_norm_rope_backward_f16: dy is not a buffer");
  qk_norm_rope(ctx, "qk_norm_rope_backward_f16", x, dy, w, out, out_ld, rstd, positions, inv_freq, tokens, heads,
               head_dim, 0.0f);
}

}  // namespace forja::ops
