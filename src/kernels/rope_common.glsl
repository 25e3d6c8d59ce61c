// What the RoPE kernels (rope.comp, qk_norm_rope.comp) share: sin and cos of an fp32 angle to
// about 1e-7, not the built-ins (see rope.comp's header for why and how). `precise` keeps the
// compiler from contracting or reordering the exact steps.
void sincos_accurate(float a, out float s, out float c) {
  // pi/2 = P1 + P2 + P3 (each an fp32, P1 the nearest fp32 to pi/2); P1 = P1h + P1l, 12 bits each.
  const float P1 = 1.570796371e+00, P2 = -4.371138829e-08, P3 = -1.715124510e-15;
  const float P1h = 1.570312500e+00, P1l = 4.838705063e-04;
  const float k = roundEven(a * 6.366197467e-01);  // the nearest multiple of pi/2
  // k = kh + kl with at most 12 significant bits each, |kl| < 4096 <= |kh| or kh = 0: split the
  // magnitude in integers, exactly.
  const int ki = int(k), ka = abs(ki);
  const float sign = ki < 0 ? -1.0 : 1.0;
  const float kh = sign * float(ka & ~0xfff), kl = sign * float(ka & 0xfff);
  // k P1 = p + pe exactly (Dekker): every partial product below is exact.
  precise float p = k * P1;
  precise float pe = (((kh * P1h - p) + kh * P1l) + kl * P1h) + kl * P1l;
  // a - p is exact (Sterbenz: a and p lie within a factor 2 of each other, or p = 0).
  precise float r = (a - p) - pe;
  r = (r - k * P2) - k * P3;  // r = a - k pi/2 in [-pi/4, pi/4], error ~1e-7 absolute
  const float z = r * r;
  const float sr = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
  const float cr = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z -
                   0.5 * z + 1.0;
  // Rotate by the quadrant q = k mod 4 (two's complement keeps negative k right).
  const int q = int(k) & 3;
  const float sq = (q & 1) != 0 ? cr : sr, cq = (q & 1) != 0 ? sr : cr;
  s = (q & 2) != 0 ? -sq : sq;
  c = (q == 1 || q == 2) ? -cq : cq;
}
