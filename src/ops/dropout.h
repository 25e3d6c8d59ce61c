// LoRA dropout on the GPU (kernels/dropout.comp): PEFT applies nn.Dropout(p) to the adapter's
// input only, y = base(x) + scale * B A dropout(x), in training. Inverted dropout: an element is
// zeroed with probability p, the others are multiplied by 1 / (1 - p).
//
// The mask is never stored: keep(row, col) is a counter-based hash of a 64-bit key and the
// element's (token row, feature column), so a backward regenerates the forward's mask. Keys:
//   stream = dropout_stream(seed, step, micro_batch)     one per micro-batch of a run
//   key    = dropout_key(stream, layer, kind)            one per adapter (PEFT has one Dropout
//                                                        module per adapter, so q, k and v,
//                                                        which share their input, get
//                                                        independent masks)
// Both are splitmix64-style 64-bit mixes; tests/reference/model.py implements the same.
#pragma once
#include <cstdint>

#include "gpu/context.h"

namespace forja::ops {

// splitmix64's output function (Steele, Lea, Flood 2014) applied to z + golden gamma.
constexpr uint64_t dropout_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t dropout_stream(uint64_t seed, uint64_t step, uint64_t micro_batch) {
  return dropout_mix64(dropout_mix64(dropout_mix64(seed) ^ step) ^ micro_batch);
}
// kind: the projection's index in model::kAllLinears order (q, k, v, o, gate, up, down).
constexpr uint64_t dropout_key(uint64_t stream, uint64_t layer, uint32_t kind) {
  return dropout_mix64(stream ^ dropout_mix64(layer * 8 + kind));
}

struct DropoutParams {
  uint64_t key = 0;
  uint32_t threshold = 0;  // dropped iff hash < threshold = floor(p * 2^32)
  float scale = 1.0f;      // fp32(1 / (1 - p)), the multiplier of kept elements
};
// p in [0, 1) (std::logic_error otherwise; user input is checked in model::LoraSet).
DropoutParams dropout_params(double p, uint64_t key);

// y[r, c] (= or += with accumulate) keep(row0 + r, c) ? scale * x[r, c] : 0 for fp32 [rows, cols]
// matrices stored contiguously from element x_offset of x and y_offset of y. row0 is the mask
// row of row 0, so a matrix processed in row chunks gets the same mask as in one piece.
// y must not overlap x unless both are the same elements (y = x, no accumulate).
void dropout_apply(gpu::Context& ctx, const DropoutParams& d, const gpu::Buffer& x, uint64_t x_offset,
                   const gpu::Buffer& y, uint64_t y_offset, uint32_t row0, uint32_t rows, uint32_t cols,
                   bool accumulate);

}  // namespace forja::ops
