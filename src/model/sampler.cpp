#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "util/error.h"

namespace forja::model {

Sampler::Sampler(const SamplingSettings& s, uint64_t seed) : settings_(s), rng_(seed) {
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature))
    throw UserError("--temperature must be 0 (greedy) or positive");
  if (s.top_k < 0) throw UserError("--top-k must be 0 (off) or positive");
  if (!(s.top_p > 0 && s.top_p <= 1)) throw UserError("--top-p must be in (0, 1]");
}

int32_t Sampler::next(std::span<const float> logits) {
  if (logits.empty()) throw std::logic_error("Sampler: no logits");
  if (settings_.temperature == 0) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
  }
  // Candidates by descending logit (ties: lower id first), cut to top_k.
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t k = ids.size();
  if (settings_.top_k > 0 && size_t(settings_.top_k) < k) {
    k = size_t(settings_.top_k);
    std::nth_element(ids.begin(), ids.begin() + k, ids.end(), before);
    ids.resize(k);
  }
  std::sort(ids.begin(), ids.end(), before);
  // softmax(logits / T) over the candidates, in double.
  const double inv_t = 1.0 / settings_.temperature, top = double(logits[ids[0]]) * inv_t;
  std::vector<double> p(k);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp(double(logits[ids[i]]) * inv_t - top);
  // Nucleus: keep the smallest prefix whose probability reaches top_p (at least one token).
  size_t keep = k;
  if (settings_.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      cum += p[i] / sum;
      if (cum >= settings_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i];
  const double u = double(rng_() >> 11) * 0x1.0p-53 * total;  // uniform in [0, total)
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace forja::model
