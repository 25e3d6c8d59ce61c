#include "ops/elementwise.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/kernel_table.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

struct EwPush {
  uint32_t n;
  float alpha;
  uint32_t flag = 0;  // to_f16_checked: the flag it sets
};
struct ReducePush {
  uint32_t rows, cols, n, slot;
};
static_assert(kernels::push_block_matches<EwPush>(kernels::ew_add, kernels::ew_scale, kernels::ew_silu,
                                                  kernels::ew_silu_bwd, kernels::ew_swiglu, kernels::ew_swiglu_bwd,
                                                  kernels::ew_to_f16, kernels::ew_to_f16_checked),
              "EwPush differs from kernels/elementwise.comp's push-constant block");
static_assert(kernels::push_block_matches<ReducePush>(kernels::row_sum, kernels::row_sumsq, kernels::row_max,
                                                      kernels::sumsq_partial, kernels::sqrt_sum),
              "ReducePush differs from kernels/reduce.comp's push-constant block");

constexpr uint32_t kThreads = 256;
constexpr uint32_t kMaxGroups = 4096;  // grid-stride loops cover the rest

// Largest element count per dispatch: fits the binding limit, keeps chunk starts aligned.
uint64_t chunk_elements(const gpu::Context& ctx) {
  const uint64_t align = std::max<uint64_t>(16, ctx.info().min_storage_offset_alignment);
  uint64_t bytes = std::min<uint64_t>(ctx.info().max_storage_buffer_range, 1ull << 31) / align * align;
  return bytes / 4;
}

// Runs `variant` over n elements in chunks, each binding sliced to the chunk.
void run_elementwise(gpu::Context& ctx, const kernels::Kernel& kernel, const std::vector<gpu::Buffer>& ins,
                     const std::vector<gpu::Buffer>& outs, uint64_t n, float alpha = 0.0f) {
  if (n == 0) return;
  const char* variant = kernel.name;
  for (const auto& b : ins)
    if (b.size < n * 4) throw std::logic_error(std::string(variant) + ": input buffer smaller than n elements");
  for (const auto& b : outs)
    if (b.size < n * 4) throw std::logic_error(std::string(variant) + ": output buffer smaller than n elements");
  const auto& p = ctx.pipelines().get(kernel);
  const uint64_t chunk = chunk_elements(ctx);
  for (uint64_t start = 0; start < n; start += chunk) {
    const uint64_t len = std::min(chunk, n - start);
    std::vector<gpu::Binding> bindings;
    for (const auto& b : ins) bindings.push_back({b.slice(start * 4, len * 4), gpu::Access::read});
    for (const auto& b : outs) bindings.push_back({b.slice(start * 4, len * 4), gpu::Access::write});
    const uint32_t groups = static_cast<uint32_t>(std::min<uint64_t>((len + kThreads - 1) / kThreads, kMaxGroups));
    ctx.dispatch(p, bindings, EwPush{static_cast<uint32_t>(len), alpha}, groups, 1, 1, variant);
  }
}

void run_rows(gpu::Context& ctx, const kernels::Kernel& kernel, const gpu::Buffer& x, const gpu::Buffer& out,
              uint32_t rows, uint32_t cols) {
  if (rows == 0) return;
  const char* variant = kernel.name;
  if (x.size < uint64_t(rows) * cols * 4 || out.size < uint64_t(rows) * 4)
    throw std::logic_error(std::string(variant) + ": buffer smaller than its shape");
  if (uint64_t(rows) * cols * 4 > ctx.info().max_storage_buffer_range)
    throw std::logic_error(std::string(variant) + ": input exceeds the binding limit; split the rows");
  const auto& p = ctx.pipelines().get(kernel);
  const uint32_t gx = std::min<uint32_t>(rows, 65535), gy = (rows + gx - 1) / gx;
  ctx.dispatch(p, {{x.slice(0, uint64_t(rows) * cols * 4), gpu::Access::read}, {out, gpu::Access::write}},
               ReducePush{rows, cols, 0, 0}, gx, gy, 1, variant);
}

}  // namespace

void add(gpu::Context& ctx, const gpu::Buffer& a, const gpu::Buffer& b, const gpu::Buffer& y, uint64_t n) {
  run_elementwise(ctx, kernels::ew_add, {a, b}, {y}, n);
}
void scale(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& y, uint64_t n, float alpha) {
  run_elementwise(ctx, kernels::ew_scale, {x}, {y}, n, alpha);
}
void silu_forward(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& y, uint64_t n) {
  run_elementwise(ctx, kernels::ew_silu, {x}, {y}, n);
}
void silu_backward(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& dy, const gpu::Buffer& dx, uint64_t n) {
  run_elementwise(ctx, kernels::ew_silu_bwd, {x, dy}, {dx}, n);
}
void swiglu_forward(gpu::Context& ctx, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer& h, uint64_t n) {
  run_elementwise(ctx, kernels::ew_swiglu, {g, u}, {h}, n);
}
void swiglu_backward(gpu::Context& ctx, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer& dh,
                     const gpu::Buffer& dg, const gpu::Buffer& du, uint64_t n) {
  run_elementwise(ctx, kernels::ew_swiglu_bwd, {g, u, dh}, {dg, du}, n);
}

namespace {
// swiglu_forward_f16 (dh, du16 null) and swiglu_backward_f16: kernels/swiglu_f16.comp over rows
// split into dispatches within the binding limit.
void run_swiglu_f16(gpu::Context& ctx, const char* op, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer* dh,
                    const gpu::Buffer& out16, const gpu::Buffer* du16, uint32_t rows, uint32_t cols, uint32_t ld,
                    const Fp16RangeFlag* flag) {
  if (rows == 0 || cols == 0) return;
  if (cols % 2 || ld % 2 || cols > ld) throw std::logic_error(std::string(op) + ": cols and ld must be even, cols <= ld");
  const uint64_t in_bytes = uint64_t(rows) * cols * 4, out_bytes = (uint64_t(rows - 1) * ld + cols) * 2;
  if (g.size < in_bytes || u.size < in_bytes || (dh && dh->size < in_bytes) || out16.size < out_bytes ||
      (du16 && du16->size < out_bytes))
    throw std::logic_error(std::string(op) + ": buffer smaller than its shape");
  if (flag && flag->flags.size < (uint64_t(flag->index) + 1) * 4)
    throw std::logic_error(std::string(op) + ": flag outside its buffer");
  struct Push {
    uint32_t rows, cols, ld, g_off, u_off, dh_off, out_off, out2_off, flag;
  };
  static_assert(kernels::push_block_matches<Push>(kernels::swiglu_fwd_f16, kernels::swiglu_fwd_f16_checked,
                                                  kernels::swiglu_bwd_f16));
  const auto& p = ctx.pipelines().get(dh     ? kernels::swiglu_bwd_f16
                                      : flag ? kernels::swiglu_fwd_f16_checked
                                             : kernels::swiglu_fwd_f16);
  // Rows per dispatch: every window within the binding limit (and 32-bit indices).
  const uint64_t range = std::min<uint64_t>(usable_binding_bytes(ctx), 1ull << 31);
  const uint32_t per = static_cast<uint32_t>(
      std::max<uint64_t>(1, std::min<uint64_t>(rows, range / std::max<uint64_t>(uint64_t(cols) * 4, uint64_t(ld) * 2))));
  for (uint32_t r0 = 0; r0 < rows; r0 += per) {
    const uint32_t n = std::min(per, rows - r0);
    const uint64_t begin = uint64_t(r0) * cols * 4, len = uint64_t(n) * cols * 4;
    const uint64_t out_begin = uint64_t(r0) * ld * 2, out_len = (uint64_t(n - 1) * ld + cols) * 2;
    const Window wg = window(ctx, g, begin, len), wu = window(ctx, u, begin, len);
    const Window wo = window(ctx, out16, out_begin, out_len, 2);
    std::vector<gpu::Binding> bindings = {{wg.view, gpu::Access::read}, {wu.view, gpu::Access::read}};
    Push push{n, cols, ld, wg.first, wu.first, 0, wo.first, 0, flag ? flag->index : 0u};
    if (dh) {
      const Window wh = window(ctx, *dh, begin, len), wdu = window(ctx, *du16, out_begin, out_len, 2);
      push.dh_off = wh.first, push.out2_off = wdu.first;
      bindings.insert(bindings.end(), {{wh.view, gpu::Access::read}, {wo.view, gpu::Access::write},
                                       {wdu.view, gpu::Access::write}});
    } else {
      bindings.push_back({wo.view, gpu::Access::write});
      if (flag) bindings.push_back({flag->flags, gpu::Access::read_write});
    }
    const uint64_t pairs = uint64_t(n) * cols / 2;
    ctx.dispatch(p, bindings, push,
                 static_cast<uint32_t>(std::min<uint64_t>((pairs + kThreads - 1) / kThreads, kMaxGroups)), 1, 1,
                 dh ? "ew_swiglu_bwd" : "ew_swiglu");
  }
}
}  // namespace

void swiglu_forward_f16(gpu::Context& ctx, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer& h16,
                        uint32_t rows, uint32_t cols, uint32_t ld, const Fp16RangeFlag* flag) {
  run_swiglu_f16(ctx, "swiglu_forward_f16", g, u, nullptr, h16, nullptr, rows, cols, ld, flag);
}

void swiglu_backward_f16(gpu::Context& ctx, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer& dh,
                         const gpu::Buffer& dg16, const gpu::Buffer& du16, uint32_t rows, uint32_t cols, uint32_t ld) {
  run_swiglu_f16(ctx, "swiglu_backward_f16", g, u, &dh, dg16, &du16, rows, cols, ld, nullptr);
}

void to_f16(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& y, uint64_t n, const Fp16RangeFlag* flag) {
  if (n == 0) return;
  const uint64_t out_bytes = (n * 2 + 3) / 4 * 4;
  if (x.size < n * 4 || y.size < out_bytes) throw std::logic_error("to_f16: buffer smaller than n elements");
  if (flag && flag->flags.size < (uint64_t(flag->index) + 1) * 4) throw std::logic_error("to_f16: flag outside its buffer");
  const auto& p = ctx.pipelines().get(flag ? kernels::ew_to_f16_checked : kernels::ew_to_f16);
  // Chunks of a multiple of the alignment in elements, so that the fp16 output's chunks (half
  // the bytes) start aligned too.
  const uint64_t align = std::max<uint64_t>(16, ctx.info().min_storage_offset_alignment);
  const uint64_t chunk = chunk_elements(ctx) / align * align;
  for (uint64_t start = 0; start < n; start += chunk) {
    const uint64_t len = std::min(chunk, n - start);
    const uint64_t pairs = (len + 1) / 2;
    const uint32_t groups = static_cast<uint32_t>(std::min<uint64_t>((pairs + kThreads - 1) / kThreads, kMaxGroups));
    std::vector<gpu::Binding> bindings = {{x.slice(start * 4, len * 4), gpu::Access::read},
                                          {y.slice(start * 2, pairs * 4), gpu::Access::write}};
    if (flag) bindings.push_back({flag->flags, gpu::Access::read_write});
    ctx.dispatch(p, bindings, EwPush{static_cast<uint32_t>(len), 0.0f, flag ? flag->index : 0u}, groups, 1, 1,
                 "ew_to_f16");
  }
}

void to_f16_block(gpu::Context& ctx, const gpu::Buffer& src, uint64_t src_first, uint32_t src_ld,
                  const gpu::Buffer& dst, uint64_t dst_first, uint32_t dst_ld, uint32_t rows, uint32_t cols,
                  uint32_t width, float scale, const Fp16RangeFlag* flag, uint32_t lead) {
  if (rows == 0 || width == 0) return;
  if (flag && flag->flags.size < (uint64_t(flag->index) + 1) * 4)
    throw std::logic_error("to_f16_block: flag outside its buffer");
  if (uint64_t(lead) + cols > width || dst_first % 2 || dst_ld % 2 || width % 2 || width > dst_ld ||
      (cols > 0 && cols > src_ld))
    throw std::logic_error("to_f16_block: bad block shape (even dst offset, row stride and width; lead + cols <= width)");
  const uint64_t src_span = cols > 0 ? uint64_t(rows - 1) * src_ld + cols : 0;
  const uint64_t dst_span = uint64_t(rows - 1) * dst_ld + width;
  if ((src_first + src_span) * 4 > src.size || (dst_first + dst_span) * 2 > dst.size)
    throw std::logic_error("to_f16_block: the block reaches past its buffer");
  struct Push {
    uint32_t rows, cols, width, src_ld, src_off, dst_ld, dst_off;
    float scale;
    uint32_t flag, lanes, lead;
  };
  static_assert(kernels::push_block_matches<Push>(kernels::to_f16_block, kernels::to_f16_block_checked));
  // Four halves per invocation where every chunk of 4 is aligned in both matrices (window() starts
  // bindings at 16-byte multiples, so the element offsets inside them keep these residues).
  const bool vec4 = src_first % 4 == 0 && src_ld % 4 == 0 && dst_first % 4 == 0 && dst_ld % 4 == 0 &&
                    lead % 4 == 0 && cols % 4 == 0 && width % 4 == 0;
  const uint32_t vec = vec4 ? 4 : 2;
  const auto& p = ctx.pipelines().get(flag ? kernels::to_f16_block_checked : kernels::to_f16_block, {vec});
  // Rows per dispatch: both windows within the binding limit (and 32-bit indices).
  const uint64_t range = std::min<uint64_t>(usable_binding_bytes(ctx), 1ull << 31);
  const uint64_t row_bytes = std::max<uint64_t>(uint64_t(src_ld) * 4 * (cols > 0), uint64_t(dst_ld) * 2);
  // Invocations per row: the row's chunks rounded up to a power of two, at most a workgroup; a
  // workgroup takes kThreads / lanes rows, at most 65535 workgroup rows per dispatch.
  uint32_t lanes = 1;
  while (lanes < kThreads && lanes * vec < width) lanes *= 2;
  const uint32_t rows_per_group = kThreads / lanes;
  const uint32_t per = static_cast<uint32_t>(
      std::max<uint64_t>(1, std::min<uint64_t>({rows, range / row_bytes, uint64_t(65535) * rows_per_group})));
  for (uint32_t r0 = 0; r0 < rows; r0 += per) {
    const uint32_t n = std::min(per, rows - r0);
    const Window ws = cols > 0 ? window(ctx, src, (src_first + uint64_t(r0) * src_ld) * 4,
                                        (uint64_t(n - 1) * src_ld + cols) * 4)
                               : window(ctx, src, 0, 4);
    const Window wd = window(ctx, dst, (dst_first + uint64_t(r0) * dst_ld) * 2, (uint64_t(n - 1) * dst_ld + width) * 2, 2);
    const uint32_t groups_x = (width / vec + lanes - 1) / lanes;
    std::vector<gpu::Binding> bindings = {{ws.view, gpu::Access::read}, {wd.view, gpu::Access::write}};
    if (flag) bindings.push_back({flag->flags, gpu::Access::read_write});
    ctx.dispatch(p, bindings,
                 Push{n, cols, width, src_ld, ws.first, dst_ld, wd.first, scale, flag ? flag->index : 0u, lanes, lead},
                 groups_x, (n + rows_per_group - 1) / rows_per_group, 1, "to_f16_block");
  }
}

void add_row_bias(gpu::Context& ctx, const gpu::Buffer& bias, const gpu::Buffer& y, uint32_t rows, uint32_t cols) {
  const uint64_t n = uint64_t(rows) * cols;
  if (n == 0) return;
  if (bias.size < uint64_t(cols) * 4 || y.size < n * 4) throw std::logic_error("add_row_bias: buffer smaller than its shape");
  if (n * 4 > ctx.info().max_storage_buffer_range) throw std::logic_error("add_row_bias: y exceeds the binding limit");
  struct Push {
    uint32_t n, cols;
  };
  static_assert(kernels::push_block_matches<Push>(kernels::bias));
  const auto& p = ctx.pipelines().get(kernels::bias);
  const uint32_t groups = static_cast<uint32_t>(std::min<uint64_t>((n + kThreads - 1) / kThreads, kMaxGroups));
  ctx.dispatch(p, {{bias, gpu::Access::read}, {y.slice(0, n * 4), gpu::Access::read_write}},
               Push{static_cast<uint32_t>(n), cols}, groups, 1, 1, "add_row_bias");
}

void row_sum(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& out, uint32_t rows, uint32_t cols) {
  run_rows(ctx, kernels::row_sum, x, out, rows, cols);
}
void row_sum_squares(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& out, uint32_t rows, uint32_t cols) {
  run_rows(ctx, kernels::row_sumsq, x, out, rows, cols);
}
void row_max(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& out, uint32_t rows, uint32_t cols) {
  run_rows(ctx, kernels::row_max, x, out, rows, cols);
}

void global_l2_norm(gpu::Context& ctx, const std::vector<VectorRef>& buffers, const gpu::Buffer& out) {
  // Pass 1: each chunk of each buffer writes kGroups partial sums of squares into `partials`
  // (every slot is written, so no clearing is needed).
  constexpr uint32_t kGroups = 64;
  const uint64_t chunk = chunk_elements(ctx);
  uint64_t slots = 0;
  for (const auto& v : buffers) slots += (v.n + chunk - 1) / chunk * kGroups;
  gpu::Buffer partials = ctx.alloc(std::max<uint64_t>(slots, 1) * 4, "global norm partials");
  const auto& p = ctx.pipelines().get(kernels::sumsq_partial);
  uint32_t slot = 0;
  for (const auto& v : buffers) {
    if (v.buffer.size < v.n * 4) throw std::logic_error("global_l2_norm: buffer smaller than n elements");
    for (uint64_t start = 0; start < v.n; start += chunk) {
      const uint64_t len = std::min(chunk, v.n - start);
      // Each dispatch writes its own slice of partials, so they need no barriers between them.
      ctx.dispatch(p,
                   {{v.buffer.slice(start * 4, len * 4), gpu::Access::read},
                    {partials.slice(uint64_t(slot) * 4, kGroups * 4), gpu::Access::write}},
                   ReducePush{0, 0, static_cast<uint32_t>(len), 0}, kGroups, 1, 1, "sumsq_partial");
      slot += kGroups;
    }
  }
  // Pass 2: one workgroup sums the partials and takes the square root.
  const auto& f = ctx.pipelines().get(kernels::sqrt_sum);
  ctx.dispatch(f, {{partials, gpu::Access::read}, {out, gpu::Access::write}},
               ReducePush{0, 0, static_cast<uint32_t>(slots), 0}, 1, 1, 1, "sqrt_sum");
  ctx.free(partials);
}

}  // namespace forja::ops
