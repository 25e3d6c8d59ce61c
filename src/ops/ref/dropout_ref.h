// LoRA dropout mask (ops/dropout.h, kernels/dropout.comp): CPU re-implementation of the
// counter-based hash, written from the kernel's description, for bit-exact mask tests.
//
//   mix32(v): v ^= v >> 16; v *= 0x7feb352d; v ^= v >> 15; v *= 0x846ca68b; v ^= v >> 16  (mod 2^32)
//   hash(key, row, col) = mix32(mix32(mix32(col ^ key_hi) ^ row) ^ key_lo)
//   keep = hash >= threshold
#pragma once
#include <cstdint>

namespace forja::ref {

uint32_t dropout_hash(uint64_t key, uint32_t row, uint32_t col);

// mask[rows, cols] = keep(row0 + r, c) ? 1 / (1 - p) : 0, the multiplier lora_ref.h's
// `dropmask` takes, with threshold = floor(p * 2^32) (p in [0, 1)).
void dropout_mask(double* mask, uint64_t key, double p, uint32_t row0, int64_t rows, int64_t cols);

}  // namespace forja::ref
