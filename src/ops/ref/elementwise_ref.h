// Elementwise ops and row reductions: double-precision references.
//
// Flat arrays of n elements; outputs may alias inputs (each element is read before it is written).
// Reductions treat x as row-major [rows, cols] and write one value per row.
#pragma once
#include <cstdint>

namespace forja::ref {

// y[n] = a[n] + b[n]
void add(double* y, const double* a, const double* b, int64_t n);

// y[n] = s * x[n]
void scale(double* y, const double* x, double s, int64_t n);

// silu(z) = z * sigmoid(z), computed without overflow for large |z|.
double silu(double z);
// d silu / dz = sigmoid(z) * (1 + z * (1 - sigmoid(z)))
double silu_grad(double z);

// y[n] = silu(x[n])
void silu_forward(double* y, const double* x, int64_t n);
// dx[n] = dy[n] * silu'(x[n])   (activation gradient: written with =)
void silu_backward(double* dx, const double* dy, const double* x, int64_t n);

// out[rows] = sum over cols of x[rows, cols]
void row_sum(double* out, const double* x, int64_t rows, int64_t cols);
// out[rows] = sum over cols of x[rows, cols]^2
void row_sum_squares(double* out, const double* x, int64_t rows, int64_t cols);
// out[rows] = max over cols of x[rows, cols]; -inf for cols == 0; NaN if the row has a NaN
void row_max(double* out, const double* x, int64_t rows, int64_t cols);

// sqrt(sum over buffers b, elements i of bufs[b][i]^2): the global L2 norm of several gradient
// buffers (formats.md 6.3), equal to the L2 norm of the per-buffer L2 norms.
// bufs[num_bufs], sizes[num_bufs].
double global_l2_norm(const double* const* bufs, const int64_t* sizes, int64_t num_bufs);

}  // namespace forja::ref
