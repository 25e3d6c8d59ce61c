#include "ops/ref/dropout_ref.h"

#include <cmath>
#include <stdexcept>

namespace forja::ref {

namespace {
uint32_t mix32(uint32_t v) {
  v ^= v >> 16;
  v *= 0x7feb352du;
  v ^= v >> 15;
  v *= 0x846ca68bu;
  v ^= v >> 16;
  return v;
}
}  // namespace

uint32_t dropout_hash(uint64_t key, uint32_t row, uint32_t col) {
  const uint32_t lo = static_cast<uint32_t>(key), hi = static_cast<uint32_t>(key >> 32);
  return mix32(mix32(mix32(col ^ hi) ^ row) ^ lo);
}

void dropout_mask(double* mask, uint64_t key, double p, uint32_t row0, int64_t rows, int64_t cols) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("dropout_mask: p must be in [0, 1)");
  const double threshold = std::floor(p * 4294967296.0);
  const double keep_value = 1.0 / (1.0 - p);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t h = dropout_hash(key, row0 + static_cast<uint32_t>(r), static_cast<uint32_t>(c));
      mask[r * cols + c] = double(h) >= threshold ? keep_value : 0.0;
    }
}

}  // namespace forja::ref
