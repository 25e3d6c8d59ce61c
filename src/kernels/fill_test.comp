#version 450
// Smallest kernel: y[i] = x[i] * a + b. Exercises the runtime (bindings, push constants,
// hazards) in tests/gpu.
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform PC { uint n; float a; float b; } pc;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < pc.n) y[i] = x[i] * pc.a + pc.b;
}
