#version 450
// LoRA dropout (PEFT's nn.Dropout on the adapter's input) without a stored mask: whether element
// (row, col) is kept is a hash of (key, row, col), so the backward (and activation checkpointing's
// recomputation) regenerates exactly the forward's mask from the same key. The host derives one
// key per (seed, step, micro-batch, layer, projection) (ops/dropout.h); row is the token's index
// in the micro-batch, col the feature.
//   keep(row, col) = hash(row, col) >= threshold,  threshold = floor(p * 2^32)
//   y[r, c] (= or +=) keep(row0 + r, c) ? scale * x[r, c] : 0,   scale = fp32(1 / (1 - p))
// hash = three rounds of lowbias32 (Chris Wellons' 32-bit integer mixer, 2 multiplies each):
//   h = mix(col ^ key_hi); h = mix(h ^ row); h = mix(h ^ key_lo)
// ops/ref/dropout_ref.cpp and tests/reference/model.py implement the same function.
// `first_*` are element offsets of row 0 inside the bindings (the op binds aligned windows).
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint rows, cols;
  uint first_x, first_y;
  uint row0;            // mask row of this dispatch's row 0 (token index in the micro-batch)
  uint key_lo, key_hi;
  uint threshold;
  float scale;
  uint accumulate;      // 1: y += result
} pc;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };

uint mix32(uint v) {
  v ^= v >> 16;
  v *= 0x7feb352du;
  v ^= v >> 15;
  v *= 0x846ca68bu;
  v ^= v >> 16;
  return v;
}

void main() {
  const uint n = pc.rows * pc.cols;
  const uint stride = gl_NumWorkGroups.x * 256u;
  for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
    const uint r = i / pc.cols, c = i - r * pc.cols;
    uint h = mix32(c ^ pc.key_hi);
    h = mix32(h ^ (pc.row0 + r));
    h = mix32(h ^ pc.key_lo);
    const float v = h >= pc.threshold ? pc.scale * x[pc.first_x + i] : 0.0;
    if (pc.accumulate != 0u) {
      y[pc.first_y + i] += v;
    } else {
      y[pc.first_y + i] = v;
    }
  }
}
