// Shared by the GEMM kernels: the push constants and the operand addressing.
//
//   C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b],   b = gl_WorkGroupID.z
//   op(A) is M x K: A stored [M, K] (TA = 0, element (m,k) at m*lda + k) or [K, M] (TA = 1,
//   at k*lda + m); op(B) is K x N: B stored [K, N] (TB = 0, at k*ldb + n) or [N, K] (TB = 1,
//   at n*ldb + k; a PyTorch Linear weight, so y = x W^T is TA = 0, TB = 1).
// All offsets and strides are in elements. beta == 0 never reads C (it may hold NaN).

layout(push_constant) uniform GemmPush {
  uint M, N, K;
  uint lda, ldb, ldc;
  uint a_offset, b_offset, c_offset;     // element offset of batch 0
  uint a_stride, b_stride, c_stride;     // elements between batches
  float alpha, beta;
} pc;
