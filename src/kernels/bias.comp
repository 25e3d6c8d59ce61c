#version 450
// y[r, c] += b[c] for a row-major fp32 [rows, cols] y: the bias of a projection (Qwen2's q/k/v,
// Llama's attention_bias / mlp_bias). Frozen, so there is no backward kernel.
layout(local_size_x = 256) in;
layout(push_constant) uniform PC { uint n; uint cols; } pc;
layout(set = 0, binding = 0) readonly buffer B { float b[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
void main() {
  const uint stride = gl_NumWorkGroups.x * 256u;
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) y[i] += b[i % pc.cols];
}
