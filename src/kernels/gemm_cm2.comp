#version 450
// GEMM on NVIDIA matrix cores through GL_NV_cooperative_matrix2: fp16 B, fp16 or fp32 A (rounded
// to fp16 as it is loaded), fp32 accumulation and C, all four transposes, strided batches, alpha
// and beta: the contract of gemm_common.glsl, like gemm_coopmat.comp.
//
// One workgroup-scope cooperative matrix per operand: the shader says "load this BM x BK slice of
// op(A) and this BK x BN slice of op(B), multiply-accumulate" and the driver's compiler picks the
// per-subgroup split, the shared-memory staging and the pipelining (measured on an H200 at
// 200-270 TFLOP/s against 127-152 for the v1 kernel: ../shared/tools/cm2probe, docs/benchmarks.md).
//
// Addressing with tensor layouts: a stored matrix is a 2-D layout (rows, cols) with its leading
// dimension as row stride, and the batch's element offset is the load's offset. A transposed
// operand (TA = 1: A stored [K, M]; TB = 1: B stored [N, K]) is read through a view that swaps
// the two dimensions. gemm_cm2_edge uses clamp-to-constant layouts, so reads past the matrix give
// zero and stores past it are dropped: any M, N, K. gemm_cm2 (no bounds handling) is for products
// whose M, N, K are multiples of the tile (the host checks): the large training products.
//
// ALIGNED (host: every leading dimension a multiple of 8) tells the compiler that rows start
// 16-byte aligned, so it can use wide loads and stores.
//
// Specialization constants: 0 workgroup size (one the driver lists for workgroup scope), 1 BM,
// 2 BN, 3 BK, 4 UNROLL (K tiles per loop body), 5 GROUP_M (raster swizzle: GROUP_M consecutive
// M tiles share a run of N tiles in L2), 6 TA, 7 TB, 8 ALIGNED.
//! variant gemm_cm2 requires=nv_coopmat2
//! variant gemm_cm2_edge -DEDGE requires=nv_coopmat2
//! variant gemm_cm2_af32 -DA_F32 requires=nv_coopmat2
//! variant gemm_cm2_af32_edge -DA_F32 -DEDGE requires=nv_coopmat2
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_GOOGLE_include_directive : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint BK = 64;
layout(constant_id = 4) const uint UNROLL = 4;
layout(constant_id = 5) const uint GROUP_M = 1;
layout(constant_id = 6) const uint TA = 0;
layout(constant_id = 7) const uint TB = 1;
layout(constant_id = 8) const uint ALIGNED = 0;

#include "gemm_common.glsl"

#ifdef A_F32
layout(set = 0, binding = 0) readonly buffer BufA { float A[]; };
#else
layout(set = 0, binding = 0) readonly buffer BufA { float16_t A[]; };
#endif
layout(set = 0, binding = 1) readonly buffer BufB { float16_t B[]; };
layout(set = 0, binding = 2) buffer BufC { float C[]; };

#define MAT_A coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>
#define MAT_ACC coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>
// fp32 A goes through an fp32 matrix of A's shape, converted (with its use) to fp16.
#define MAT_A32 coopmat<float, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseAccumulator>

#ifdef EDGE
#define LAYOUT tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV>
#define NEW_LAYOUT() createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV)
#else
#define LAYOUT tensorLayoutNV<2>
#define NEW_LAYOUT() createTensorLayoutNV(2)
#endif

// The output tile of this workgroup (x = N tiles, y = M tiles); with GROUP_M > 1 the linear
// workgroup id walks GROUP_M M tiles down before moving one N tile right.
void tile_of(out uint tm, out uint tn) {
  if (GROUP_M <= 1u) {
    tm = gl_WorkGroupID.y;
    tn = gl_WorkGroupID.x;
    return;
  }
  const uint tiles_n = gl_NumWorkGroups.x, tiles_m = gl_NumWorkGroups.y;
  const uint pid = gl_WorkGroupID.y * tiles_n + gl_WorkGroupID.x;
  const uint span = GROUP_M * tiles_n;
  const uint first = (pid / span) * GROUP_M;
  const uint rows = min(tiles_m - first, GROUP_M);
  const uint r = pid % span;
  tm = first + r % rows;
  tn = r / rows;
}

uint row_stride(uint ld) { return ALIGNED != 0u ? (ld & ~7u) : ld; }

// acc += op(A)[m0.., k0..] * op(B)[k0.., n0..] for one K tile (a macro: written out in place,
// as the probe's kernel is, so nothing stands between the driver and its pipelining).
#ifdef A_F32
#define LOAD_A(a)                                                                                   \
  {                                                                                                 \
    MAT_A32 a32;                                                                                    \
    if (TA == 0u) coopMatLoadTensorNV(a32, A, abase, sliceTensorLayoutNV(tA, m0, BM, k0, BK));       \
    else coopMatLoadTensorNV(a32, A, abase, sliceTensorLayoutNV(tA, k0, BK, m0, BM), swapped);      \
    a = MAT_A(a32);                                                                                 \
  }
#else
#define LOAD_A(a)                                                                                   \
  if (TA == 0u) coopMatLoadTensorNV(a, A, abase, sliceTensorLayoutNV(tA, m0, BM, k0, BK));           \
  else coopMatLoadTensorNV(a, A, abase, sliceTensorLayoutNV(tA, k0, BK, m0, BM), swapped)
#endif
#define MULTIPLY_ADD()                                                                              \
  {                                                                                                 \
    MAT_A a;                                                                                        \
    MAT_B b;                                                                                        \
    LOAD_A(a);                                                                                      \
    if (TB == 0u) coopMatLoadTensorNV(b, B, bbase, sliceTensorLayoutNV(tB, k0, BK, n0, BN));         \
    else coopMatLoadTensorNV(b, B, bbase, sliceTensorLayoutNV(tB, n0, BN, k0, BK), swapped);        \
    acc = coopMatMulAdd(a, b, acc);                                                                 \
  }

void main() {
  uint tm, tn;
  tile_of(tm, tn);
  const uint m0 = tm * BM, n0 = tn * BN;
  const uint batch = gl_WorkGroupID.z;
  const uint abase = pc.a_offset + batch * pc.a_stride;
  const uint bbase = pc.b_offset + batch * pc.b_stride;
  const uint cbase = pc.c_offset + batch * pc.c_stride;

  // Stored shapes: A [M, K] or [K, M]; B [K, N] or [N, K]; C [M, N].
  LAYOUT tA = NEW_LAYOUT();
  tA = TA == 0u ? setTensorLayoutDimensionNV(tA, pc.M, pc.K) : setTensorLayoutDimensionNV(tA, pc.K, pc.M);
  tA = setTensorLayoutStrideNV(tA, row_stride(pc.lda), 1);
  LAYOUT tB = NEW_LAYOUT();
  tB = TB == 0u ? setTensorLayoutDimensionNV(tB, pc.K, pc.N) : setTensorLayoutDimensionNV(tB, pc.N, pc.K);
  tB = setTensorLayoutStrideNV(tB, row_stride(pc.ldb), 1);
  LAYOUT tC = NEW_LAYOUT();
  tC = setTensorLayoutDimensionNV(tC, pc.M, pc.N);
  tC = setTensorLayoutStrideNV(tC, row_stride(pc.ldc), 1);
  tensorViewNV<2, false, 1, 0> swapped = createTensorViewNV(2, false, 1, 0);

  MAT_ACC acc = MAT_ACC(0.0);
  // Whole bodies of UNROLL K tiles without a bounds test (the driver pipelines their loads),
  // then the remaining K tiles one by one, as the probe's kernel does.
  const uint num_k = (pc.K + BK - 1u) / BK;
  const uint bodies = num_k / UNROLL;
  uint k0 = 0;
  for (uint i = 0; i < bodies; ++i) {
    [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
      MULTIPLY_ADD();
      k0 += BK;
    }
  }
  for (uint i = bodies * UNROLL; i < num_k; ++i) {
    MULTIPLY_ADD();
    k0 += BK;
  }
  if (pc.alpha != 1.0) acc = acc * pc.alpha;
  if (pc.beta != 0.0) {
    MAT_ACC c;
    coopMatLoadTensorNV(c, C, cbase, sliceTensorLayoutNV(tC, m0, BM, n0, BN));
    acc = acc + c * pc.beta;
  }
  coopMatStoreTensorNV(acc, C, cbase, sliceTensorLayoutNV(tC, m0, BM, n0, BN));
}
