// Helpers for the reference-op tests: seeded random inputs and a central finite-difference
// gradient check.
//
// Every backward is checked the same way: pick a random cotangent dy, define the scalar
// L(inputs) = sum(dy * forward(inputs)), and compare the analytic gradient from the backward with
// (L(x + h e_i) - L(x - h e_i)) / 2h for every element i of every differentiated input.
// Error measure: max_i |analytic_i - numeric_i| / max_i |numeric_i| (a relative error that is
// not blown up by elements whose gradient happens to be near 0). Central differences in double
// with h = 1e-6 reach ~1e-9 on these sizes, so the 1e-6 bound has margin but still catches a
// wrong term (see RefFiniteDiff.DetectsAWrongGradient).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

namespace forja::ref::test {

inline constexpr double kFdStep = 1e-6;
inline constexpr double kFdTol = 1e-6;

inline std::vector<double> random_vec(std::mt19937_64& rng, size_t n, double lo = -1.0,
                                      double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double acc = 0.0;
  for (size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
  return acc;
}

struct FdResult {
  double rel_error = 0.0;    // max |analytic - numeric| / max |numeric|
  double max_numeric = 0.0;  // max |numeric|: a test also asserts this is not ~0
};

// Perturbs x in place (restoring it) and evaluates loss() around each element.
inline FdResult fd_check(std::vector<double>& x, const std::vector<double>& analytic,
                         const std::function<double()>& loss, double h = kFdStep) {
  FdResult r;
  double max_diff = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    const double numeric = (lp - lm) / (2.0 * h);
    max_diff = std::max(max_diff, std::fabs(numeric - analytic[i]));
    r.max_numeric = std::max(r.max_numeric, std::fabs(numeric));
  }
  r.rel_error = r.max_numeric > 0.0 ? max_diff / r.max_numeric : max_diff;
  if (std::getenv("FORJA_REF_VERBOSE") != nullptr) {  // to see the margin under the bound
    std::fprintf(stderr, "fd_check: %zu elements, rel_error %.3g, max |grad| %.3g\n", x.size(),
                 r.rel_error, r.max_numeric);
  }
  return r;
}

// Max |a - b| / max(max |b|, floor).
inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b,
                           double floor = 1e-300) {
  double diff = 0.0, scale = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

}  // namespace forja::ref::test

// Asserts the finite-difference check passed and that the gradient is not trivially zero.
#define EXPECT_FD_OK(result)                                   \
  do {                                                         \
    const auto fd_r_ = (result);                               \
    EXPECT_LT(fd_r_.rel_error, ::forja::ref::test::kFdTol);    \
    EXPECT_GT(fd_r_.max_numeric, 1e-3) << "gradient is ~zero"; \
  } while (0)
