#version 450
// The second half of a split-K GEMM (ops/gemm.cpp): the slices' partial products, each already
// scaled by alpha and stored contiguously as P[s][m][n] (fp32 [slices, M, N]), are summed in
// slice order (deterministic) into C:  C[m, n] = sum_s P[s][m][n] + beta * C[m, n]. beta == 0
// never reads C (it may hold NaN), as gemm_common.glsl promises for the one-pass kernels.
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint m, n, ldc, c_offset, slices;
  float beta;
} pc;
layout(set = 0, binding = 0) readonly buffer Partial { float partial[]; };
layout(set = 0, binding = 1) buffer C { float c[]; };

void main() {
  const uint count = pc.m * pc.n, stride = gl_NumWorkGroups.x * 256u;
  for (uint e = gl_GlobalInvocationID.x; e < count; e += stride) {
    float acc = 0.0;
    for (uint s = 0u; s < pc.slices; ++s) acc += partial[s * count + e];
    const uint at = pc.c_offset + (e / pc.n) * pc.ldc + e % pc.n;
    c[at] = pc.beta != 0.0 ? acc + pc.beta * c[at] : acc;
  }
}
