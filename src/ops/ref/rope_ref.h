// RoPE, half-split ("rotate_half") layout (formats.md 1.5): double-precision reference.
//
// x, y: [tokens, heads, head_dim]; element j < head_dim/2 pairs with j + head_dim/2:
//   y_j       = x_j cos(a_j) - x_{j+d/2} sin(a_j)
//   y_{j+d/2} = x_{j+d/2} cos(a_j) + x_j sin(a_j)
// with a_j = pos[t] * inv_freq[j].
//
// Why the angle is rounded to float32: transformers computes freqs = position * inv_freq in fp32
// with autocast off. For a position p the fp32 product carries an absolute error of up to
// ~p * 2^-24 radians (about 1e-3 rad at p = 16k), far larger than every other difference
// between an fp32 GPU kernel and a double reference. So the reference forms the angle exactly
// as fp32 does: float(pos) * float(inv_freq[j]) rounded to float, and only then takes cos/sin in
// double. A kernel that computes the angle the same way then agrees to fp32 precision.
#pragma once
#include <cstdint>

namespace forja::ref {

// The default-type table (T-RoPE _compute_default_rope_parameters):
// inv_freq[head_dim/2] = 1 / theta^(float(2j) / head_dim), every step rounded to float32 as torch
// does (the power itself is computed in double and rounded; torch's powf may differ by 1 ulp).
void rope_inv_freq_default(double* inv_freq, int64_t head_dim, double theta);

// The fp32 angle the references use: float(float(pos) * float(inv_freq)).
float rope_angle(int32_t pos, double inv_freq);

// y[tokens, heads, head_dim] = rope(x); pos[tokens] (position ids, e.g. restarting at 0 for each
// packed segment); inv_freq[head_dim/2]. head_dim must be even. y may alias x.
void rope_forward(double* y, const double* x, const int32_t* pos, const double* inv_freq,
                  int64_t tokens, int64_t heads, int64_t head_dim);

// dx = rope^T(dy): the inverse rotation (activation gradient: written with =). dx may alias dy.
void rope_backward(double* dx, const double* dy, const int32_t* pos, const double* inv_freq,
                   int64_t tokens, int64_t heads, int64_t head_dim);

}  // namespace forja::ref
