// Elementwise fp32 ops and reductions (kernels/elementwise.comp, kernels/reduce.comp).
// Buffers hold fp32 values from their first byte; `n` counts elements. Arrays larger than the
// device's binding limit are processed in chunks. Outputs may alias inputs.
#pragma once
#include <cstdint>
#include <vector>

#include "gpu/context.h"

namespace forja::ops {

void add(gpu::Context& ctx, const gpu::Buffer& a, const gpu::Buffer& b, const gpu::Buffer& y, uint64_t n);
void scale(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& y, uint64_t n, float alpha);
void silu_forward(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& y, uint64_t n);
void silu_backward(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& dy, const gpu::Buffer& dx, uint64_t n);
// h = silu(g) * u
void swiglu_forward(gpu::Context& ctx, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer& h, uint64_t n);
// dg = dh * u * silu'(g), du = dh * silu(g)
void swiglu_backward(gpu::Context& ctx, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer& dh,
                     const gpu::Buffer& dg, const gpu::Buffer& du, uint64_t n);

// Mixed precision's range check: a rounding to fp16 given one sets flags[index] (uint32) to
// nonzero when a finite value is beyond fp16's range (|x| >= 65520, which rounds to infinity).
// The flags are only ever raised (atomic OR); the caller zeroes them.
struct Fp16RangeFlag {
  gpu::Buffer flags;
  uint32_t index = 0;
};

// SwiGLU with fp16 outputs (kernels/swiglu_f16.comp): h = silu(g) * u, or dg and du of the
// backward, rounded to fp16 (round to nearest even, as to_f16_block) into columns [0, cols) of
// fp16 [rows, ld] blocks (the rest of each row is left as it is), from fp32 g, u, dh [rows,
// cols]. For mixed precision's projections that read these only as fp16 with the LoRA factor
// beside them (down's input; gate's and up's dy). cols and ld even, cols <= ld; the blocks hold
// rows * ld halves (the fp32 buffers of h, dg and du have room for them: 2 cols >= ld). flag:
// the forward range check, as to_f16. Rows are split into dispatches within the binding limit.
void swiglu_forward_f16(gpu::Context& ctx, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer& h16,
                        uint32_t rows, uint32_t cols, uint32_t ld, const Fp16RangeFlag* flag = nullptr);
void swiglu_backward_f16(gpu::Context& ctx, const gpu::Buffer& g, const gpu::Buffer& u, const gpu::Buffer& dh,
                         const gpu::Buffer& dg16, const gpu::Buffer& du16, uint32_t rows, uint32_t cols, uint32_t ld);

// y = x rounded to fp16 (round to nearest even, as io::float_to_f16), y packed fp16 [n] (bytes:
// n * 2 rounded up to 4; an odd n writes a 0 after the last value).
void to_f16(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& y, uint64_t n,
            const Fp16RangeFlag* flag = nullptr);

// A block of rows x width fp16 values in dst (row stride dst_ld halves, from half dst_first) =
// scale * src rounded to fp16 (round to nearest even) in its columns [lead, lead + cols) and 0 in
// the rest: src fp32 [rows, cols] with row stride src_ld from element src_first. For operands
// assembled side by side (kernels/to_f16_block.comp). dst_first, dst_ld and width must be even,
// lead + cols <= width; with cols = 0 src is not read (a block of zeros). Rows are split into
// dispatches within the binding limit.
void to_f16_block(gpu::Context& ctx, const gpu::Buffer& src, uint64_t src_first, uint32_t src_ld,
                  const gpu::Buffer& dst, uint64_t dst_first, uint32_t dst_ld, uint32_t rows, uint32_t cols,
                  uint32_t width, float scale = 1.0f, const Fp16RangeFlag* flag = nullptr, uint32_t lead = 0);

// y[r, :] += bias for y fp32 [rows, cols], bias fp32 [cols].
void add_row_bias(gpu::Context& ctx, const gpu::Buffer& bias, const gpu::Buffer& y, uint32_t rows, uint32_t cols);

// out[r] = sum / sum of squares / max of x[r, 0..cols), x row-major [rows, cols].
void row_sum(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& out, uint32_t rows, uint32_t cols);
void row_sum_squares(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& out, uint32_t rows, uint32_t cols);
void row_max(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& out, uint32_t rows, uint32_t cols);

struct VectorRef {
  gpu::Buffer buffer;
  uint64_t n = 0;  // fp32 elements
};
// out[0] = sqrt(sum over all buffers of sum of squares): the global L2 norm used for gradient
// clipping (formats.md 6.3), in fp32.
void global_l2_norm(gpu::Context& ctx, const std::vector<VectorRef>& buffers, const gpu::Buffer& out);

}  // namespace forja::ops
