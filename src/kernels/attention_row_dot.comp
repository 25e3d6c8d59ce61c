#version 450
// D = rowsum(dout * out) per (token, head), the statistic of attention's backward (dS = P (dP -
// D)), for the fused backward (flash_backward_khr.comp), which reads it per query tile.
// out and dout fp32 [tokens, heads, d]; drow fp32 [B, heads, S] like lse. One invocation per row.
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint rows;  // tokens * heads
  uint n_heads, head_dim, seq;
  uint out_off, dout_off, drow_off;  // element offsets in their bindings
} pc;
layout(set = 0, binding = 0) readonly buffer Out { float o[]; };
layout(set = 0, binding = 1) readonly buffer DOut { float dout[]; };
layout(set = 0, binding = 2) writeonly buffer Drow { float drow[]; };
void main() {
  const uint stride = gl_NumWorkGroups.x * 256u;
  for (uint r = gl_GlobalInvocationID.x; r < pc.rows; r += stride) {
    const uint token = r / pc.n_heads, h = r % pc.n_heads;
    const uint b = token / pc.seq, s = token % pc.seq;
    float sum = 0.0;
    for (uint c = 0u; c < pc.head_dim; ++c) sum += o[pc.out_off + r * pc.head_dim + c] * dout[pc.dout_off + r * pc.head_dim + c];
    drow[pc.drow_off + (b * pc.n_heads + h) * pc.seq + s] = sum;
  }
}
