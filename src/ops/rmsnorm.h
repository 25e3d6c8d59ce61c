// RMSNorm over the last axis (formats.md 1.4; kernels/rmsnorm.comp), fp32 activations.
//
//   rstd[r] = 1 / sqrt(mean_c(x[r, c]^2) + eps);   y[r, c] = w[c] * (x[r, c] * rstd[r])
//
// Used for the hidden norms (rows = tokens, cols = hidden) and Qwen3's per-head q/k norms
// (rows = tokens * heads, cols = head_dim, one [head_dim] weight shared by all heads).
// The multiply by w runs in fp32 (no rounding to the checkpoint dtype in between: activations
// are fp32 here). Tensors larger than the device's binding limit are processed in row chunks.
#pragma once
#include <cstdint>

#include "gpu/context.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"

namespace forja::ops {

// x, y fp32 [rows, cols]; w [cols] in w_dtype (f32 or f16); rstd fp32 [rows], saved for the
// backward. y may alias x.
void rmsnorm_forward(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, DType w_dtype, const gpu::Buffer& y,
                     const gpu::Buffer& rstd, uint32_t rows, uint32_t cols, float eps);

// The same with y rounded to fp16 (round to nearest even, as to_f16_block) into columns [0, cols)
// of an fp16 [rows, ld] block y16 (the rest of each row left as it is), w fp32: for mixed
// precision's projections that read their input only as fp16, with the LoRA factor folded in
// beside it (model/transformer.cpp). cols and ld even, cols <= ld; y16 must not overlap x.
// flag: the forward range check, as to_f16.
void rmsnorm_forward_f16(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, const gpu::Buffer& y16,
                         const gpu::Buffer& rstd, uint32_t rows, uint32_t cols, uint32_t ld, float eps,
                         const Fp16RangeFlag* flag = nullptr);

// dx = d(sum dy * y)/dx given dy [rows, cols] and the forward's x and rstd (the weights are
// frozen: no dw):  dx = rstd * w * dy - x * rstd^3 / cols * sum_c(dy * w * x).
// accumulate = false writes dx (which may then alias dy); accumulate = true adds the result to
// dx, folding the residual-stream add into the norm's backward (dx must not alias dy then).
void rmsnorm_backward(gpu::Context& ctx, const gpu::Buffer& dy, const gpu::Buffer& x, const gpu::Buffer& w, DType w_dtype,
                      const gpu::Buffer& rstd, const gpu::Buffer& dx, uint32_t rows, uint32_t cols, bool accumulate);

}  // namespace forja::ops
