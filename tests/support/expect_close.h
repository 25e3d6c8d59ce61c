// Element-wise comparison against a double-precision reference: |got - want| <= rtol (1 + |want|)
// (false for NaN); -inf and +inf must match exactly. Reports the first five mismatches and
// returns the worst error among the elements that passed (FORJA_REF_VERBOSE=1 prints it).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace forja::test {

inline double expect_close_rel(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                               double rtol) {
  EXPECT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    bool ok;
    if (std::isinf(want[i])) {
      ok = got[i] == want[i];
    } else {
      const double err = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
      ok = err <= rtol;
      if (ok) worst = std::max(worst, err);
    }
    if (!ok && bad++ < 5) ADD_FAILURE() << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
  EXPECT_EQ(bad, 0u) << what;
  if (std::getenv("FORJA_REF_VERBOSE")) std::fprintf(stderr, "  %-4s worst rel err %.3g\n", what, worst);
  return worst;
}

}  // namespace forja::test
