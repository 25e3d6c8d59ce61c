// fp32 -> the nearest fp16 value (round to nearest, ties to even), returned as fp32, computed with
// integer operations. The obvious float(float16_t(x)) is a conversion round trip that a compiler
// may fold away (NVIDIA's does), leaving x unrounded and the "fp16" product silently fp32;
// integer arithmetic cannot be folded. Matches io::float_to_f16 bit for bit, infinities for
// values that round beyond 65504 included.
float round_to_f16(float x) {
  const uint u = floatBitsToUint(x);
  const uint a = u & 0x7FFFFFFFu, sign = u & 0x80000000u;
  float r;
  if (a >= 0x7F800000u) {
    r = x;  // inf, NaN
  } else if (a >= 0x477FF000u) {
    r = uintBitsToFloat(sign | 0x7F800000u);  // >= 65520 rounds to infinity
  } else if (a >= 0x38800000u) {
    // normal in fp16 (>= 2^-14): keep 10 mantissa bits, round half to even
    r = uintBitsToFloat(sign | ((a + 0xFFFu + ((a >> 13) & 1u)) & 0xFFFFE000u));
  } else {
    // subnormal in fp16: a multiple of 2^-24 (the power-of-two scalings are exact)
    r = uintBitsToFloat(sign | floatBitsToUint(roundEven(uintBitsToFloat(a) * 16777216.0) * (1.0 / 16777216.0)));
  }
  return r;
}
vec4 round_to_f16(vec4 v) {
  return vec4(round_to_f16(v.x), round_to_f16(v.y), round_to_f16(v.z), round_to_f16(v.w));
}
// Whether a finite x rounds to an fp16 infinity (|x| >= 65520): beyond fp16's range. Infinities
// and NaN of fp32 are not (they are not fp16's doing).
bool beyond_f16(float x) {
  const uint a = floatBitsToUint(x) & 0x7FFFFFFFu;
  return a >= 0x477FF000u && a < 0x7F800000u;
}
