// NF4 on the GPU: the frozen base weights of QLoRA, uploaded packed (quant/nf4.h gives the
// layout), the fused products that dequantise tiles of W while loading them, so that no
// dequantised copy of a whole weight exists (kernels/nf4_gemm*.comp), and the dequantisation
// of a whole weight to fp32 or fp16 (kernels/nf4.comp; mixed-precision training dequantises one
// projection at a time to fp16 and runs the dense GEMM, model/transformer.h).
//
// For a projection weight W [rows = out_features, cols = in_features]:
//   forward         y  [M, rows] = alpha * x  [M, cols] · W^T + beta * y    nf4_gemm_xwt
//   input gradient  dx [M, cols] = alpha * dy [M, rows] · W   + beta * dx   nf4_gemm_dyw
// x, y, dy, dx are fp32, row-major, leading dimension = row length, starting at the start of
// their buffer views. beta == 0 never reads the output (it may hold NaN).
//
// `operands` chooses the arithmetic: f32 multiplies x (dy) by the decoded W in fp32 (the scalar
// kernel; the reference precision); f16 rounds x (dy) and the decoded W to fp16 on load and
// accumulates in fp32 (as bitsandbytes' 16-bit compute dtype does): the cooperative-matrix
// kernel on a device with GL_NV_cooperative_matrix 16x16x16 f16 -> f32, the scalar kernel's
// fp16-rounding variant elsewhere (or with FORJA_NO_COOPMAT=1).
#pragma once
#include <cstdint>

#include "gpu/context.h"
#include "quant/nf4.h"
#include "ops/gemm.h"

namespace forja::ops {

// A quantised weight on the GPU, uploaded from quant::Nf4Tensor (rows = out, cols = in).
struct Nf4Weight {
  gpu::Buffer packed;         // uint8 [(rows*cols+1)/2], even element in the high nibble
  gpu::Buffer absmax;         // fp32 [blocks] without double quantisation, uint8 codes [blocks] with it
  gpu::Buffer nested_absmax;  // fp32 [ceil(blocks/256)] (double quant only)
  gpu::Buffer code8;          // fp32 [256] dynamic map (double quant only)
  float absmax_offset = 0;
  bool double_quant = false;
  uint32_t rows = 0, cols = 0;
};

// t.shape = {rows, cols} (a 1-D tensor is one row). Throws std::logic_error when the packed
// weight would exceed the device's binding limit (maxStorageBufferRange) or 2^31 elements.
Nf4Weight upload_nf4(gpu::Context& ctx, const quant::Nf4Tensor& t);
void free_nf4(gpu::Context& ctx, Nf4Weight& w);

// A block written beside the weight by the same dispatch (fp16 with a row stride only): rows x
// width halves from half dst_first of the output (at its row stride), = fp16(scale * src) (round
// to nearest even) for the first valid_rows rows and cols columns of src (fp32, row stride src_ld,
// from element src_first) placed from the block's column lead, 0 elsewhere: ops::to_f16_block's
// block, for the LoRA factor a folded product takes beside W (width and dst_first multiples of 8).
struct Nf4Beside {
  gpu::Buffer src;
  uint64_t src_first = 0;
  uint32_t src_ld = 0;
  uint64_t dst_first = 0;
  uint32_t rows = 0, width = 0, valid_rows = 0, cols = 0;
  float scale = 1.0f;
  uint32_t lead = 0;
};

// out [rows, cols] = dequant(W): fp32 bit-identical to quant::nf4_dequantize (tests, merges), or
// fp16 rounded to nearest even (mixed precision dequantises a layer's weight into a scratch
// buffer and multiplies with the dense cooperative-matrix GEMM; rows x cols a multiple of 8).
// Outputs beyond the binding limit are written in several dispatches. out_ld (fp16 only, 0 = cols):
// row r goes to elements [r * out_ld, r * out_ld + cols) of out, leaving columns beside each row
// for another operand (cols and out_ld multiples of 8; the whole output within one binding).
void nf4_dequantize(gpu::Context& ctx, const Nf4Weight& w, const gpu::Buffer& out, DType out_dtype = DType::f32,
                    uint32_t out_ld = 0, const Nf4Beside* beside = nullptr);

// The kernel `automatic` resolves to on this device for `operands`: scalar for f32; coopmat, or
// scalar (rounding to fp16) where there is none, for f16.
GemmKernel nf4_gemm_kernel_for(const gpu::Context& ctx, DType operands = DType::f32);

// y [M, rows] = alpha * x [M, cols] · dequant(W)^T + beta * y      (forward: y = x W^T)
// The cooperative-matrix kernels (coopmat, coopmat_emulated) need operands = f16.
void nf4_gemm_xwt(gpu::Context& ctx, const gpu::Buffer& x, const Nf4Weight& w, const gpu::Buffer& y, uint32_t m,
                  float alpha = 1.0f, float beta = 0.0f, DType operands = DType::f32,
                  GemmKernel kernel = GemmKernel::automatic);
// dx [M, cols] = alpha * dy [M, rows] · dequant(W) + beta * dx    (input gradient: dx = dy W)
void nf4_gemm_dyw(gpu::Context& ctx, const gpu::Buffer& dy, const Nf4Weight& w, const gpu::Buffer& dx, uint32_t m,
                  float alpha = 1.0f, float beta = 0.0f, DType operands = DType::f32,
                  GemmKernel kernel = GemmKernel::automatic);

}  // namespace forja::ops
