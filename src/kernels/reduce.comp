#version 450
// Reductions in fp32 with a shared-memory tree (portable: no subgroup size assumed).
//   row_sum / row_sumsq / row_max: out[r] = reduce over x[r, 0..cols); one workgroup per row
//     (row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x).      (x, out)
//   sumsq_partial: partial[slot + w] = sum of squares of workgroup w's grid-stride share of
//     x[0..n).                                                              (x, partial)
//   sqrt_sum: out[0] = sqrt(sum of partial[0..n)); one workgroup.           (partial, out)
//! variant row_sum -DROW -DOP_SUM
//! variant row_sumsq -DROW -DOP_SUMSQ
//! variant row_max -DROW -DOP_MAX
//! variant sumsq_partial -DPARTIAL
//! variant sqrt_sum -DFINAL
layout(local_size_x = 256) in;
layout(push_constant) uniform PC { uint rows; uint cols; uint n; uint slot; } pc;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer O { float o[]; };

shared float red[256];

#ifdef OP_MAX
#define IDENTITY (-1.0 / 0.0)
#define COMBINE(a, b) max(a, b)
#define TERM(v) (v)
#elif defined(OP_SUM)
#define IDENTITY 0.0
#define COMBINE(a, b) ((a) + (b))
#define TERM(v) (v)
#else
#define IDENTITY 0.0
#define COMBINE(a, b) ((a) + (b))
#define TERM(v) ((v) * (v))
#endif

float tree(float v) {
  const uint t = gl_LocalInvocationIndex;
  red[t] = v;
  barrier();
  for (uint s = 128u; s > 0u; s >>= 1) {
    if (t < s) red[t] = COMBINE(red[t], red[t + s]);
    barrier();
  }
  return red[0];
}

void main() {
  const uint t = gl_LocalInvocationIndex;
#ifdef ROW
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= pc.rows) return;  // uniform per workgroup
  float acc = IDENTITY;
  for (uint c = t; c < pc.cols; c += 256u) acc = COMBINE(acc, TERM(x[row * pc.cols + c]));
  float r = tree(acc);
  if (t == 0u) o[row] = r;
#elif defined(PARTIAL)
  float acc = 0.0;
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += gl_NumWorkGroups.x * 256u) acc += x[i] * x[i];
  float r = tree(acc);
  if (t == 0u) o[pc.slot + gl_WorkGroupID.x] = r;
#else
  float acc = 0.0;
  for (uint i = t; i < pc.n; i += 256u) acc += x[i];
  float r = tree(acc);
  if (t == 0u) o[0] = sqrt(r);
#endif
}
