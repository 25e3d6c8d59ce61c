// Conversions between float32 and the two 16-bit float formats of checkpoints: bfloat16 (the
// top half of a float32) and IEEE binary16 (F16). Round-to-nearest-even on the way down, as
// PyTorch does, so a bf16/f16 tensor written here is bit-identical to `tensor.to(dtype)`.
#pragma once
#include <bit>
#include <cstdint>

namespace forja::io {

inline float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<std::uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                        // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: value = mant * 2^-24; normalise it into a float32.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline std::uint16_t float_to_f16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even. Adding 0.5f moves
    // the bits into place and lets the FPU do the rounding.
    float scaled = std::bit_cast<float>(abs) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(scaled) - 0x3f000000u));
  }
  std::uint32_t v = abs - (112u << 23);  // rebias 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);        // round to nearest, ties to even
  return static_cast<std::uint16_t>(sign | (v >> 13));
}

}  // namespace forja::io
