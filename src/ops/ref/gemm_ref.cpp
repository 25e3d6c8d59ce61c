// Reference GEMM, four transpose combinations, row-major with leading dimensions. See gemm_ref.h.
#include "ops/ref/gemm_ref.h"

#include "ops/ref/check_ref.h"

namespace forja::ref {

void gemm_ld(double* c, int64_t ldc, const double* a, int64_t lda, const double* b, int64_t ldb,
             int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, double alpha,
             double beta) {
  detail::require_dims("gemm", {m, n, k});
  detail::require(ldc >= n, "gemm", "ldc < n");
  detail::require(lda >= (trans_a ? m : k), "gemm", "lda smaller than op(A)'s stored row");
  detail::require(ldb >= (trans_b ? k : n), "gemm", "ldb smaller than op(B)'s stored row");
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const double bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      double& out = c[i * ldc + j];
      out = beta == 0.0 ? alpha * acc : alpha * acc + beta * out;
    }
  }
}

void gemm(double* c, const double* a, const double* b, int64_t m, int64_t n, int64_t k,
          bool trans_a, bool trans_b, double alpha, double beta) {
  gemm_ld(c, n, a, trans_a ? m : k, b, trans_b ? k : n, m, n, k, trans_a, trans_b, alpha, beta);
}

}  // namespace forja::ref
