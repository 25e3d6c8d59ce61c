// gemm: the double-precision reference of the general matrix product, in the BLAS convention
// but row-major:
//
//   C = alpha * op(A) * op(B) + beta * C
//
// op(A) is [m, k]: A is stored [m, k] (lda >= k) when !trans_a, or [k, m] (lda >= m) when trans_a.
// op(B) is [k, n]: B is stored [k, n] (ldb >= n) when !trans_b, or [n, k] (ldb >= k) when trans_b.
// C is stored [m, n] with ldc >= n; elements of C beyond column n in each row are never touched.
// When beta == 0, C is not read (so it may hold NaN or garbage), as in BLAS.
// Sums run over k in order, in double; k == 0 gives C = beta * C.
#pragma once
#include <cstdint>

namespace forja::ref {

// Packed operands: lda/ldb/ldc are the stored row lengths implied by the shapes.
void gemm(double* c, const double* a, const double* b, int64_t m, int64_t n, int64_t k,
          bool trans_a, bool trans_b, double alpha = 1.0, double beta = 0.0);

// Explicit leading dimensions (row strides in elements).
void gemm_ld(double* c, int64_t ldc, const double* a, int64_t lda, const double* b, int64_t ldb,
             int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, double alpha,
             double beta);

}  // namespace forja::ref
