#include "ops/rmsnorm.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernel_table.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

// Push constants of kernels/rmsnorm.comp.
struct RmsnormPush {
  uint32_t rows, cols;
  uint32_t first_x, first_r;  // element offsets of the chunk's first row inside the bindings
  float eps;
  uint32_t accumulate;
  uint32_t first_y, ld_y, flag;  // the fp16 output (forward_f16)
};
static_assert(kernels::push_block_matches<RmsnormPush>(kernels::rmsnorm_fwd_f32, kernels::rmsnorm_fwd_f16,
                                                       kernels::rmsnorm_fwd_out16, kernels::rmsnorm_fwd_out16_checked,
                                                       kernels::rmsnorm_bwd_f32, kernels::rmsnorm_bwd_f16),
              "RmsnormPush differs from kernels/rmsnorm.comp's push-constant block");

// Workgroup size and invocations per row for a row of `cols`. On a GPU: workgroups of 256,
// rows of about four columns per invocation, 32 to 256 of them, so that short rows (q/k norms
// over head_dim) share a workgroup instead of leaving most of it idle. On a CPU (lavapipe) every
// barrier of the reduction costs a pass over all invocations, so there rows get the fewest, 32,
// two rows to a workgroup (which keeps the tests on the shared-workgroup path).
struct RowShape {
  uint32_t wg, lanes;
};
RowShape row_shape(const gpu::Context& ctx, uint32_t cols) {
  if (ctx.info().is_cpu()) return {64, 32};
  uint32_t lanes = 32;
  while (lanes < 256 && lanes * 4 < cols) lanes *= 2;
  return {256, lanes};
}

// The dispatch grid for `rows` rows, rows_per_group to a workgroup (x up to 65535, then y).
std::pair<uint32_t, uint32_t> grid(uint32_t rows, uint32_t rows_per_group) {
  const uint32_t groups = (rows + rows_per_group - 1) / rows_per_group;
  const uint32_t gx = std::min<uint32_t>(groups, 65535);
  return {gx, (groups + gx - 1) / gx};
}

// Rows per dispatch such that a [rows, cols] fp32 chunk, shifted down to an aligned binding
// start and rounded up to 16 bytes, stays within the binding limit.
uint32_t rows_per_chunk(const gpu::Context& ctx, const char* op, uint32_t cols) {
  const uint64_t usable = usable_binding_bytes(ctx);
  const uint64_t rows = usable / (uint64_t(cols) * 4);
  if (rows == 0) throw std::logic_error(std::string(op) + ": one row of " + std::to_string(cols) +
                                        " columns exceeds the device's storage-buffer binding limit");
  return static_cast<uint32_t>(std::min<uint64_t>(rows, UINT32_MAX));
}

void check_weights(const gpu::Context& ctx, const char* op, const gpu::Buffer& w, DType w_dtype, uint32_t cols) {
  check_buffer(ctx, op, "w", w, uint64_t(cols) * dtype_bytes(w_dtype));
  if (w_dtype == DType::f16 && !ctx.info().storage_buffer_16bit)
    throw std::logic_error(std::string(op) + ": fp16 weights need storageBuffer16BitAccess, which this device lacks");
}

}  // namespace

void rmsnorm_forward(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, DType w_dtype, const gpu::Buffer& y,
                     const gpu::Buffer& rstd, uint32_t rows, uint32_t cols, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  if (rows == 0) return;
  if (cols == 0) throw std::logic_error("rmsnorm_forward: cols must be positive");
  const uint64_t bytes = uint64_t(rows) * cols * 4;
  check_buffer(ctx, op, "x", x, bytes);
  check_buffer(ctx, op, "y", y, bytes);
  check_buffer(ctx, op, "rstd", rstd, uint64_t(rows) * 4);
  check_weights(ctx, op, w, w_dtype, cols);
  const RowShape rs = row_shape(ctx, cols);
  const auto& p =
      ctx.pipelines().get(w_dtype == DType::f16 ? kernels::rmsnorm_fwd_f16 : kernels::rmsnorm_fwd_f32, {rs.wg, rs.lanes});
  const uint32_t chunk = rows_per_chunk(ctx, op, cols);
  const gpu::Buffer wv = w.slice(0, std::min<uint64_t>(w.size, (uint64_t(cols) * dtype_bytes(w_dtype) + 15) / 16 * 16));
  for (uint32_t r0 = 0; r0 < rows; r0 += std::min(chunk, rows - r0)) {
    const uint32_t n = std::min(chunk, rows - r0);
    const uint64_t begin = uint64_t(r0) * cols * 4, len = uint64_t(n) * cols * 4;
    const Window xw = window(ctx, x, begin, len, 4), yw = window(ctx, y, begin, len, 4);
    const Window rw = window(ctx, rstd, uint64_t(r0) * 4, uint64_t(n) * 4, 4);
    // x and y have aligned starts, so their chunks start at the same element offset.
    const RmsnormPush push{n, cols, xw.first, rw.first, eps, 0, 0, 0, 0};
    const auto [gx, gy] = grid(n, rs.wg / rs.lanes);
    ctx.dispatch(p,
                 {{xw.view, gpu::Access::read},
                  {wv, gpu::Access::read},
                  {yw.view, gpu::Access::write},
                  {rw.view, gpu::Access::write}},
                 push, gx, gy, 1, op, 4.0 * double(n) * cols);
  }
}

void rmsnorm_forward_f16(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, const gpu::Buffer& y16,
                         const gpu::Buffer& rstd, uint32_t rows, uint32_t cols, uint32_t ld, float eps,
                         const Fp16RangeFlag* flag) {
  constexpr const char* op = "rmsnorm_forward_f16";
  if (rows == 0) return;
  if (cols == 0 || cols % 2 || ld % 2 || cols > ld)
    throw std::logic_error("rmsnorm_forward_f16: cols and ld must be even and positive, cols <= ld");
  check_buffer(ctx, op, "x", x, uint64_t(rows) * cols * 4);
  check_buffer(ctx, op, "y16", y16, (uint64_t(rows - 1) * ld + cols) * 2);
  check_buffer(ctx, op, "rstd", rstd, uint64_t(rows) * 4);
  check_weights(ctx, op, w, DType::f32, cols);
  if (flag && flag->flags.size < (uint64_t(flag->index) + 1) * 4)
    throw std::logic_error("rmsnorm_forward_f16: flag outside its buffer");
  const RowShape rs = row_shape(ctx, cols);
  const auto& p = ctx.pipelines().get(flag ? kernels::rmsnorm_fwd_out16_checked : kernels::rmsnorm_fwd_out16,
                                      {rs.wg, rs.lanes});
  // Rows per dispatch: x's and y16's windows within the binding limit.
  const uint32_t chunk = std::min(rows_per_chunk(ctx, op, cols), rows_per_chunk(ctx, op, ld / 2));
  const gpu::Buffer wv = w.slice(0, std::min<uint64_t>(w.size, (uint64_t(cols) * 4 + 15) / 16 * 16));
  for (uint32_t r0 = 0; r0 < rows; r0 += std::min(chunk, rows - r0)) {
    const uint32_t n = std::min(chunk, rows - r0);
    const Window xw = window(ctx, x, uint64_t(r0) * cols * 4, uint64_t(n) * cols * 4);
    const Window yw = window(ctx, y16, uint64_t(r0) * ld * 2, (uint64_t(n - 1) * ld + cols) * 2, 2);
    const Window rw = window(ctx, rstd, uint64_t(r0) * 4, uint64_t(n) * 4, 4);
    const RmsnormPush push{n, cols, xw.first, rw.first, eps, 0, yw.first, ld, flag ? flag->index : 0u};
    const auto [gx, gy] = grid(n, rs.wg / rs.lanes);
    std::vector<gpu::Binding> bindings = {{xw.view, gpu::Access::read},
                                          {wv, gpu::Access::read},
                                          {yw.view, gpu::Access::write},
                                          {rw.view, gpu::Access::write}};
    if (flag) bindings.push_back({flag->flags, gpu::Access::read_write});
    ctx.dispatch(p, bindings, push, gx, gy, 1, "rmsnorm_forward", 4.0 * double(n) * cols);
  }
}

void rmsnorm_backward(gpu::Context& ctx, const gpu::Buffer& dy, const gpu::Buffer& x, const gpu::Buffer& w, DType w_dtype,
                      const gpu::Buffer& rstd, const gpu::Buffer& dx, uint32_t rows, uint32_t cols, bool accumulate) {
  constexpr const char* op = "rmsnorm_backward";
  if (rows == 0) return;
  if (cols == 0) throw std::logic_error("rmsnorm_backward: cols must be positive");
  const uint64_t bytes = uint64_t(rows) * cols * 4;
  check_buffer(ctx, op, "dy", dy, bytes);
  check_buffer(ctx, op, "x", x, bytes);
  check_buffer(ctx, op, "dx", dx, bytes);
  check_buffer(ctx, op, "rstd", rstd, uint64_t(rows) * 4);
  check_weights(ctx, op, w, w_dtype, cols);
  if (accumulate && dx.buffer == dy.buffer && dx.offset < dy.offset + bytes && dy.offset < dx.offset + bytes)
    throw std::logic_error("rmsnorm_backward: with accumulate, dx must not overlap dy");
  const RowShape rs = row_shape(ctx, cols);
  const auto& p =
      ctx.pipelines().get(w_dtype == DType::f16 ? kernels::rmsnorm_bwd_f16 : kernels::rmsnorm_bwd_f32, {rs.wg, rs.lanes});
  const uint32_t chunk = rows_per_chunk(ctx, op, cols);
  const gpu::Buffer wv = w.slice(0, std::min<uint64_t>(w.size, (uint64_t(cols) * dtype_bytes(w_dtype) + 15) / 16 * 16));
  for (uint32_t r0 = 0; r0 < rows; r0 += std::min(chunk, rows - r0)) {
    const uint32_t n = std::min(chunk, rows - r0);
    const uint64_t begin = uint64_t(r0) * cols * 4, len = uint64_t(n) * cols * 4;
    const Window dyw = window(ctx, dy, begin, len, 4), xw = window(ctx, x, begin, len, 4),
                 dxw = window(ctx, dx, begin, len, 4);
    const Window rw = window(ctx, rstd, uint64_t(r0) * 4, uint64_t(n) * 4, 4);
    const RmsnormPush push{n, cols, xw.first, rw.first, 0.0f, accumulate ? 1u : 0u, 0, 0, 0};
    const auto [gx, gy] = grid(n, rs.wg / rs.lanes);
    ctx.dispatch(p,
                 {{dyw.view, gpu::Access::read},
                  {xw.view, gpu::Access::read},
                  {wv, gpu::Access::read},
                  {rw.view, gpu::Access::read},
                  {dxw.view, accumulate ? gpu::Access::read_write : gpu::Access::write}},
                 push, gx, gy, 1, op, 7.0 * double(n) * cols);
  }
}

}  // namespace forja::ops
