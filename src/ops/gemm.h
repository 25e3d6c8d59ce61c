// GEMM: C = alpha * op(A) * op(B) + beta * C with fp32 accumulation (kernels/gemm*.comp).
//
// op(A) is M x K (A stored [M,K], or [K,M] when trans_a); op(B) is K x N (B stored [K,N], or
// [N,K] when trans_b: y = x W^T for a Linear weight W is trans_b = true). C is fp32 [M,N].
// Operands are both fp32, both fp16, or A fp32 and B fp16 ("mixed": A is rounded to fp16 as it
// is loaded, so the product is that of two fp16 matrices with fp32 accumulation whichever
// kernel runs; mixed-precision training multiplies fp32 activations by fp16 weights so, without
// fp16 copies of the activations). Matrices are views: a buffer, an element offset
// and a leading dimension (row stride in elements), so slices of larger tensors work directly.
// Operands larger than the device's maxStorageBufferRange are split into several dispatches.
//
// Kernel families: the scalar tiled kernel everywhere; with an fp16 B (fp16 or mixed operands) a
// matrix-core family where the device has one, best first:
//   nv-coopmat2  GL_NV_cooperative_matrix2, workgroup-scope matrices and tensor layouts
//                (kernels/gemm_cm2.comp); NVIDIA. Products with M or N under 128 (LoRA's rank-r
//                products, short chunks) go to the next family, whose 64x64 tile wastes less.
//   khr-coopmat  GL_KHR_cooperative_matrix (kernels/gemm_coopmat.comp -DKHR) at the fragment shape
//                and subgroup size the device lists: AMD, Intel, NVIDIA.
//   coopmat      GL_NV_cooperative_matrix v1, 16x16x16 at subgroup 32 (the same kernel).
// FORJA_GEMM_FAMILY=nv-coopmat2|khr-coopmat|coopmat|scalar caps automatic at that family (it
// still falls back when the device lacks it); FORJA_NO_COOPMAT=1 is FORJA_GEMM_FAMILY=scalar.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "gpu/context.h"

namespace forja::ops {

enum class DType { f32, f16 };
inline uint32_t dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

// A row-major matrix view.
struct MatrixView {
  gpu::Buffer buffer;
  DType dtype = DType::f32;
  uint64_t offset = 0;  // elements from the start of `buffer`
  uint32_t ld = 0;      // row stride in elements
};

struct GemmShape {
  uint32_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  // Strided batches: batch b uses offsets + b * stride (elements).
  uint32_t batch = 1;
  uint64_t a_stride = 0, b_stride = 0, c_stride = 0;
  // Split-K: the K range is cut into this many slices, multiplied as a batch into an fp32 scratch
  // and summed by a second kernel. 0 = automatic (gemm_split_k_slices), 1 = never. Single
  // products only (batch 1; batched products ignore it).
  uint32_t split_k = 0;
  // The name the GPU profile (FORJA_PROFILE=1) files the product under; nullptr: the kernel's.
  // Must outlive the profile (a string literal).
  const char* op = nullptr;
};

// scalar picks its tile by the shape; scalar_t64 / scalar_t128 force one (tests, benchmarks).
// coopmat_emulated runs the cooperative-matrix kernels' tiling with scalar code (any device; the
// tests' way to cover the matrix-core paths on lavapipe).
enum class GemmKernel {
  automatic,
  scalar,
  scalar_t64,
  scalar_t128,
  coopmat,
  coopmat_emulated,
  khr_coopmat,
  nv_coopmat2
};

// Whether this device (and this binary) can run the kernel.
bool gemm_kernel_available(const gpu::Context& ctx, GemmKernel k);

// The kernel `automatic` resolves to on this device for B of dtype `operands` (A fp32 or the same).
GemmKernel gemm_kernel_for(const gpu::Context& ctx, DType operands);
std::string gemm_kernel_name(GemmKernel k);

// The slices automatic split-K uses for this product: more than 1 only for single products
// whose output covers few tiles but whose K is long (LoRA's x A^T, dy B, dy^T t, dt^T x with
// rank 16: one 64-wide tile row or column, K in the thousands), which would otherwise run on a
// handful of workgroups while most of a GPU idles.
uint32_t gemm_split_k_slices(const GemmShape& shape);

// An fp16 copy of a product's C, written with it (gemm's `copies`): rows [0, M) of an fp16 block
// at half `offset` of `buffer`, row stride `ld` halves, holding fp16(C) (round to nearest even,
// as to_f16_block) in columns [0, N) and zeros in [N, width). N, offset, ld and width even. For the
// fp16 copies a folded LoRA product reads (model/transformer_linear.cpp: dt beside dy and in dt16): a
// split product's summing kernel writes them (kernels/gemm_split_k.comp), other products are
// followed by to_f16_block.
struct GemmF16Copy {
  gpu::Buffer buffer;
  uint64_t offset = 0;
  uint32_t ld = 0, width = 0;
};

// C (=|+=) the sum of `slices` fp32 [M, N] matrices stored one after another from the start of
// `parts` (kernels/gemm_split_k.comp: summed in slice order, deterministic; beta 0 never reads
// C): split-K's second half, and any kernel's partial results summed the same way.
// `copies` (at most two): fp16 copies of C written by the same dispatch (GemmF16Copy).
void gemm_sum_slices(gpu::Context& ctx, const gpu::Buffer& parts, uint32_t slices, uint32_t m, uint32_t n,
                     const MatrixView& c, float beta, const char* op = "gemm_split_k",
                     std::span<const GemmF16Copy> copies = {});

// The output tile (rows x columns) of the cooperative-matrix kernel for this product on a device
// with `compute_units` SMs / CUs (0 = unknown): the largest tile that gives enough workgroups,
// passing over one whose last wave would leave many compute units idle.
struct CoopTileSize {
  uint32_t rows = 0, cols = 0;
};
CoopTileSize gemm_coop_tile_size(const GemmShape& shape, uint32_t compute_units);

// `copies` (at most two, single products only): fp16 copies of C made with it (GemmF16Copy).
void gemm(gpu::Context& ctx, const GemmShape& shape, const MatrixView& a, const MatrixView& b, const MatrixView& c,
          GemmKernel kernel = GemmKernel::automatic, std::span<const GemmF16Copy> copies = {});

// The emulated cooperative-matrix kernel at a given fragment shape and subgroup size (8, 16 or
// 32 per side; m*n a multiple of the subgroup size): runs the tiling and addressing that the KHR
// kernels use on other vendors' fragment shapes, on any device.
void gemm_emulated(gpu::Context& ctx, const GemmShape& shape, const MatrixView& a, const MatrixView& b,
                   const MatrixView& c, const gpu::KhrFragment& fragment);

}  // namespace forja::ops
