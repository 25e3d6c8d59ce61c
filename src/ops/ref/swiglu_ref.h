// SwiGLU, the gate of the MLP: h = silu(g) * u, with g = gate_proj(x), u = up_proj(x)
// (formats.md 1.3). Double-precision reference; arrays are [n] (e.g. n = tokens * intermediate).
#pragma once
#include <cstdint>

namespace forja::ref {

// h[n] = silu(g[n]) * u[n]
void swiglu_forward(double* h, const double* g, const double* u, int64_t n);

// dg[n] = dh * u * silu'(g);  du[n] = dh * silu(g)   (activation gradients: written with =)
void swiglu_backward(double* dg, double* du, const double* dh, const double* g, const double* u,
                     int64_t n);

}  // namespace forja::ref
