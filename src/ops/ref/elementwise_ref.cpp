// Elementwise ops and row reductions. See elementwise_ref.h.
#include "ops/ref/elementwise_ref.h"

#include <cmath>
#include <limits>

#include "ops/ref/check_ref.h"

namespace forja::ref {

namespace {

double sigmoid(double z) {
  // Two branches so exp never overflows.
  if (z >= 0.0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

}  // namespace

void add(double* y, const double* a, const double* b, int64_t n) {
  detail::require_dims("add", {n});
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void scale(double* y, const double* x, double s, int64_t n) {
  detail::require_dims("scale", {n});
  for (int64_t i = 0; i < n; ++i) y[i] = s * x[i];
}

double silu(double z) { return z * sigmoid(z); }

double silu_grad(double z) {
  const double s = sigmoid(z);
  return s * (1.0 + z * (1.0 - s));
}

void silu_forward(double* y, const double* x, int64_t n) {
  detail::require_dims("silu_forward", {n});
  for (int64_t i = 0; i < n; ++i) y[i] = silu(x[i]);
}

void silu_backward(double* dx, const double* dy, const double* x, int64_t n) {
  detail::require_dims("silu_backward", {n});
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * silu_grad(x[i]);
}

void row_sum(double* out, const double* x, int64_t rows, int64_t cols) {
  detail::require_dims("row_sum", {rows, cols});
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    for (int64_t c = 0; c < cols; ++c) acc += x[r * cols + c];
    out[r] = acc;
  }
}

void row_sum_squares(double* out, const double* x, int64_t rows, int64_t cols) {
  detail::require_dims("row_sum_squares", {rows, cols});
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    for (int64_t c = 0; c < cols; ++c) acc += x[r * cols + c] * x[r * cols + c];
    out[r] = acc;
  }
}

void row_max(double* out, const double* x, int64_t rows, int64_t cols) {
  detail::require_dims("row_max", {rows, cols});
  for (int64_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < cols; ++c) {
      const double v = x[r * cols + c];
      m = (std::isnan(v) || v > m) ? v : m;  // NaN propagates (once NaN, nothing is > it)
    }
    out[r] = m;
  }
}

double global_l2_norm(const double* const* bufs, const int64_t* sizes, int64_t num_bufs) {
  detail::require_dims("global_l2_norm", {num_bufs});
  double acc = 0.0;
  for (int64_t b = 0; b < num_bufs; ++b) {
    detail::require_dims("global_l2_norm", {sizes[b]});
    for (int64_t i = 0; i < sizes[b]; ++i) acc += bufs[b][i] * bufs[b][i];
  }
  return std::sqrt(acc);
}

}  // namespace forja::ref
