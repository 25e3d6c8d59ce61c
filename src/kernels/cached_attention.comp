#version 450
// Attention of a few new queries against a KV cache (generation: the prefill of a prompt chunk
// and then one token at a time), fp32, GQA. See ops/cached_attention.h for the layout.
//
// One workgroup per (query head, query). The keys are walked in tiles of 128: each invocation
// scores one key of the tile (a dot product over head_dim), the tile's maximum and sum come
// from shared-memory tree reductions, and then invocation c < head_dim accumulates output
// element c over the tile's keys with the online-softmax rescaling of flash-attention, so the
// memory is O(1) in the context length.                      (q, k_cache, v_cache, out)
//! variant cached_attention
layout(local_size_x = 128) in;
layout(push_constant) uniform PC {
  uint n_heads;
  uint n_kv_heads;
  uint head_dim;   // <= 128
  uint first_pos;  // cache position of query 0; query t sees cache positions [0, first_pos + t]
  float scale;
} pc;
layout(set = 0, binding = 0) readonly buffer Q { float q[]; };        // [queries, n_heads, d]
layout(set = 0, binding = 1) readonly buffer K { float k_cache[]; };  // [positions, n_kv_heads, d]
layout(set = 0, binding = 2) readonly buffer V { float v_cache[]; };  // [positions, n_kv_heads, d]
layout(set = 0, binding = 3) writeonly buffer O { float o[]; };       // [queries, n_heads, d]

const uint TILE = 128u;
shared float qs[TILE];
shared float p[TILE];
shared float red[TILE];

float reduce_max(float v) {
  const uint tid = gl_LocalInvocationID.x;
  red[tid] = v;
  barrier();
  for (uint s = TILE / 2u; s > 0u; s >>= 1u) {
    if (tid < s) red[tid] = max(red[tid], red[tid + s]);
    barrier();
  }
  const float r = red[0];
  barrier();
  return r;
}

float reduce_sum(float v) {
  const uint tid = gl_LocalInvocationID.x;
  red[tid] = v;
  barrier();
  for (uint s = TILE / 2u; s > 0u; s >>= 1u) {
    if (tid < s) red[tid] += red[tid + s];
    barrier();
  }
  const float r = red[0];
  barrier();
  return r;
}

void main() {
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
  const uint d = pc.head_dim;
  const uint kvh = h / (pc.n_heads / pc.n_kv_heads);
  const uint row = pc.n_kv_heads * d;  // elements per cache position
  const uint qbase = (t * pc.n_heads + h) * d;
  if (tid < d) qs[tid] = q[qbase + tid];
  barrier();

  const uint n = pc.first_pos + t + 1u;  // visible keys
  float m = uintBitsToFloat(0xff800000u), l = 0.0, acc = 0.0;  // -inf
  for (uint j0 = 0u; j0 < n; j0 += TILE) {
    const uint j = j0 + tid;
    float s = uintBitsToFloat(0xff800000u);
    if (j < n) {
      const uint kb = j * row + kvh * d;
      float dot = 0.0;
      for (uint c = 0u; c < d; ++c) dot += qs[c] * k_cache[kb + c];
      s = dot * pc.scale;
    }
    const float m_new = max(m, reduce_max(s));  // finite: key j0 is always visible
    const float pj = j < n ? exp(s - m_new) : 0.0;
    p[tid] = pj;
    const float alpha = exp(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * alpha + reduce_sum(pj);      // its barriers also publish p[]
    if (tid < d) {
      float a = acc * alpha;
      const uint count = min(TILE, n - j0);
      uint vb = j0 * row + kvh * d + tid;
      for (uint jj = 0u; jj < count; ++jj, vb += row) a += p[jj] * v_cache[vb];
      acc = a;
    }
    m = m_new;
    barrier();  // p[] is rewritten by the next tile
  }
  if (tid < d) o[qbase + tid] = acc / l;
}
