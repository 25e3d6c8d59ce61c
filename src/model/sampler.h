// Choosing the next token from the logits, on the CPU: greedy (temperature 0: the first
// largest logit) or sampling from softmax(logits / temperature) restricted to the top_k most
// likely tokens and then to the smallest set whose probability reaches top_p (the nucleus), as
// transformers' TopK and TopP warpers do. Reproducible: the random numbers come from a
// mt19937_64 seeded with `seed`, turned into doubles by hand (no std distribution, whose
// output differs between standard libraries).
#pragma once
#include <cstdint>
#include <random>
#include <span>

namespace forja::model {

struct SamplingSettings {
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = all tokens
  double top_p = 1.0;        // 1 = no nucleus cut
};

class Sampler {
 public:
  // UserError for a negative temperature, top_k < 0 or top_p outside (0, 1].
  Sampler(const SamplingSettings& settings, uint64_t seed);
  int32_t next(std::span<const float> logits);
  const SamplingSettings& settings() const { return settings_; }

 private:
  SamplingSettings settings_;
  std::mt19937_64 rng_;
};

}  // namespace forja::model
