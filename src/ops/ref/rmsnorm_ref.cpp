// RMSNorm reference. See rmsnorm_ref.h.
#include "ops/ref/rmsnorm_ref.h"

#include <cmath>

#include "ops/ref/check_ref.h"

namespace forja::ref {

namespace {

double row_rstd(const double* x, int64_t cols, double eps) {
  double ss = 0.0;
  for (int64_t c = 0; c < cols; ++c) ss += x[c] * x[c];
  return 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
}

}  // namespace

void rmsnorm_forward(double* y, double* rstd, const double* x, const double* w, int64_t rows,
                     int64_t cols, double eps) {
  detail::require_dims("rmsnorm_forward", {rows, cols});
  detail::require(cols > 0, "rmsnorm_forward", "cols must be positive");
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x + r * cols;
    double* yr = y + r * cols;
    const double s = row_rstd(xr, cols, eps);
    for (int64_t c = 0; c < cols; ++c) yr[c] = w[c] * (xr[c] * s);
    if (rstd != nullptr) rstd[r] = s;
  }
}

void rmsnorm_backward(double* dx, const double* dy, const double* x, const double* w,
                      const double* rstd, int64_t rows, int64_t cols) {
  detail::require_dims("rmsnorm_backward", {rows, cols});
  detail::require(cols > 0, "rmsnorm_backward", "cols must be positive");
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x + r * cols;
    const double* dyr = dy + r * cols;
    double* dxr = dx + r * cols;
    const double s = rstd[r];
    double dot = 0.0;  // sum_c dy * w * x
    for (int64_t c = 0; c < cols; ++c) dot += dyr[c] * w[c] * xr[c];
    const double k = dot * s * s * s / static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) dxr[c] = s * w[c] * dyr[c] - k * xr[c];
  }
}

void rmsnorm_backward_dw(double* dw, const double* dy, const double* x, const double* rstd,
                         int64_t rows, int64_t cols) {
  detail::require_dims("rmsnorm_backward_dw", {rows, cols});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dw[c] += dy[r * cols + c] * x[r * cols + c] * rstd[r];
  }
}

}  // namespace forja::ref
