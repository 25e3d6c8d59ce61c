// SwiGLU reference. See swiglu_ref.h.
#include "ops/ref/swiglu_ref.h"

#include "ops/ref/check_ref.h"
#include "ops/ref/elementwise_ref.h"

namespace forja::ref {

void swiglu_forward(double* h, const double* g, const double* u, int64_t n) {
  detail::require_dims("swiglu_forward", {n});
  for (int64_t i = 0; i < n; ++i) h[i] = silu(g[i]) * u[i];
}

void swiglu_backward(double* dg, double* du, const double* dh, const double* g, const double* u,
                     int64_t n) {
  detail::require_dims("swiglu_backward", {n});
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[i], ui = u[i], dhi = dh[i];  // read first: dg/du may alias g/u
    dg[i] = dhi * ui * silu_grad(gi);
    du[i] = dhi * silu(gi);
  }
}

}  // namespace forja::ref
