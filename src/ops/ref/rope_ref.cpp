// RoPE reference. See rope_ref.h for the layout and why the angle is fp32.
#include "ops/ref/rope_ref.h"

#include <cfloat>
#include <cmath>

#include "ops/ref/check_ref.h"

static_assert(FLT_EVAL_METHOD == 0, "rope_angle needs float arithmetic evaluated in float");

namespace forja::ref {

namespace {

// sign = +1: forward rotation by +a; sign = -1: the transpose (rotation by -a).
void rope_apply(double* y, const double* x, const int32_t* pos, const double* inv_freq,
                int64_t tokens, int64_t heads, int64_t head_dim, double sign, const char* func) {
  detail::require_dims(func, {tokens, heads, head_dim});
  detail::require(head_dim % 2 == 0, func, "head_dim must be even");
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      const double a = static_cast<double>(rope_angle(pos[t], inv_freq[j]));
      const double c = std::cos(a), s = sign * std::sin(a);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = (t * heads + h) * head_dim;
        const double x0 = x[base + j], x1 = x[base + j + half];  // read both: y may alias x
        y[base + j] = x0 * c - x1 * s;
        y[base + j + half] = x1 * c + x0 * s;
      }
    }
  }
}

}  // namespace

void rope_inv_freq_default(double* inv_freq, int64_t head_dim, double theta) {
  detail::require(head_dim > 0 && head_dim % 2 == 0, "rope_inv_freq_default",
                  "head_dim must be even and positive");
  for (int64_t j = 0; j < head_dim / 2; ++j) {
    const float expo = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    const float p = static_cast<float>(
        std::pow(static_cast<double>(static_cast<float>(theta)), static_cast<double>(expo)));
    inv_freq[j] = static_cast<double>(1.0f / p);
  }
}

float rope_angle(int32_t pos, double inv_freq) {
  // One fp32 multiply, rounded to fp32 (FLT_EVAL_METHOD == 0: no wider intermediate).
  return static_cast<float>(pos) * static_cast<float>(inv_freq);
}

void rope_forward(double* y, const double* x, const int32_t* pos, const double* inv_freq,
                  int64_t tokens, int64_t heads, int64_t head_dim) {
  rope_apply(y, x, pos, inv_freq, tokens, heads, head_dim, 1.0, "rope_forward");
}

void rope_backward(double* dx, const double* dy, const int32_t* pos, const double* inv_freq,
                   int64_t tokens, int64_t heads, int64_t head_dim) {
  rope_apply(dx, dy, pos, inv_freq, tokens, heads, head_dim, -1.0, "rope_backward");
}

}  // namespace forja::ref
