// LoRA linear reference, built on the reference GEMM. See lora_ref.h.
#include "ops/ref/lora_ref.h"

#include <vector>

#include "ops/ref/check_ref.h"
#include "ops/ref/gemm_ref.h"

namespace forja::ref {

namespace {

// xd [tokens, in] = x * dropmask (or a copy of x).
std::vector<double> dropped(const double* x, const double* dropmask, int64_t tokens, int64_t in) {
  std::vector<double> xd(static_cast<size_t>(tokens * in));
  for (int64_t i = 0; i < tokens * in; ++i) xd[i] = dropmask ? x[i] * dropmask[i] : x[i];
  return xd;
}

}  // namespace

void lora_forward(double* y, double* xa, const double* x, const double* w, const double* bias,
                  const double* lora_a, const double* lora_b, const double* dropmask,
                  double scaling, int64_t tokens, int64_t in, int64_t out, int64_t rank) {
  detail::require_dims("lora_forward", {tokens, in, out, rank});
  const std::vector<double> xd = dropped(x, dropmask, tokens, in);
  std::vector<double> xa_local(static_cast<size_t>(tokens * rank));
  gemm(xa_local.data(), xd.data(), lora_a, tokens, rank, in, false, true);  // xd A^T
  gemm(y, x, w, tokens, out, in, false, true);                              // x W^T
  gemm(y, xa_local.data(), lora_b, tokens, out, rank, false, true, scaling, 1.0);
  if (bias != nullptr) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t o = 0; o < out; ++o) y[t * out + o] += bias[o];
    }
  }
  if (xa != nullptr) {
    for (int64_t i = 0; i < tokens * rank; ++i) xa[i] = xa_local[i];
  }
}

void lora_backward(double* dx, double* dlora_a, double* dlora_b, const double* dy, const double* x,
                   const double* w, const double* lora_a, const double* lora_b,
                   const double* dropmask, double scaling, int64_t tokens, int64_t in, int64_t out,
                   int64_t rank) {
  detail::require_dims("lora_backward", {tokens, in, out, rank});
  const std::vector<double> xd = dropped(x, dropmask, tokens, in);
  std::vector<double> xa(static_cast<size_t>(tokens * rank));
  gemm(xa.data(), xd.data(), lora_a, tokens, rank, in, false, true);
  std::vector<double> dxa(static_cast<size_t>(tokens * rank));
  gemm(dxa.data(), dy, lora_b, tokens, rank, out, false, false, scaling, 0.0);    // s dy B
  gemm(dlora_b, dy, xa.data(), out, rank, tokens, true, false, scaling, 1.0);     // += s dy^T xa
  gemm(dlora_a, dxa.data(), xd.data(), rank, in, tokens, true, false, 1.0, 1.0);  // += dxa^T xd
  if (dx != nullptr) {
    std::vector<double> dxd(static_cast<size_t>(tokens * in));
    gemm(dxd.data(), dxa.data(), lora_a, tokens, in, rank, false, false);  // dxa A
    gemm(dx, dy, w, tokens, in, out, false, false);                        // dy W
    for (int64_t i = 0; i < tokens * in; ++i) dx[i] += dropmask ? dxd[i] * dropmask[i] : dxd[i];
  }
}

void lora_merge(double* w_merged, const double* w, const double* lora_a, const double* lora_b,
                double scaling, int64_t in, int64_t out, int64_t rank) {
  detail::require_dims("lora_merge", {in, out, rank});
  for (int64_t i = 0; i < out * in; ++i) w_merged[i] = w[i];
  gemm(w_merged, lora_b, lora_a, out, in, rank, false, false, scaling, 1.0);
}

}  // namespace forja::ref
