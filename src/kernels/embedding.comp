#version 450
// Token embedding gather (formats.md 1.3 step 1): out[t, :] = table[ids[t], :] as fp32, from a
// table [vocab, hidden] in fp32 or fp16.                                  (table, ids, out)
//
// The whole table may exceed the binding limit (Qwen3: 151936 x 2560 fp16 = 778 MB), so the op
// binds it in chunks of rows [row_begin, row_begin + chunk_rows) and runs one dispatch per
// chunk; each writes only the tokens whose id falls in its chunk. Ids outside [0, vocab) read
// nothing and write zeros, in the dispatch with zero_invalid = 1 (the first chunk); the host
// validates ids elsewhere, the kernel only stays in bounds.
//
// One workgroup per token (token = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x);
// its invocations copy the hidden columns.
//! variant embedding_f32
//! variant embedding_f16 -DTABLE_F16
#ifdef TABLE_F16
#extension GL_EXT_shader_16bit_storage : require
#define TTYPE float16_t
#else
#define TTYPE float
#endif
layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint tokens;       // tokens in this dispatch
  uint hidden;
  uint vocab;
  uint row_begin;    // first table row of the bound chunk
  uint chunk_rows;   // rows in the bound chunk
  uint first_table;  // element offset of row_begin inside the table binding
  uint first_ids;    // element offset of the first token inside the ids binding
  uint first_out;    // element offset of the first token's row inside the out binding
  uint zero_invalid; // 1: write zeros for ids outside [0, vocab)
} pc;
layout(set = 0, binding = 0) readonly buffer T { TTYPE table[]; };
layout(set = 0, binding = 1) readonly buffer I { int ids[]; };
layout(set = 0, binding = 2) writeonly buffer O { float o[]; };

void main() {
  const uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (t >= pc.tokens) return;
  const int id = ids[pc.first_ids + t];
  const uint out_base = pc.first_out + t * pc.hidden;
  if (id < 0 || uint(id) >= pc.vocab) {
    if (pc.zero_invalid != 0u)
      for (uint c = gl_LocalInvocationIndex; c < pc.hidden; c += 256u) o[out_base + c] = 0.0;
    return;
  }
  // Unsigned: ids below row_begin wrap to large values and fail the test as well.
  const uint row = uint(id) - pc.row_begin;
  if (row >= pc.chunk_rows) return;  // another chunk's row
  const uint in_base = pc.first_table + row * pc.hidden;
  for (uint c = gl_LocalInvocationIndex; c < pc.hidden; c += 256u) o[out_base + c] = float(table[in_base + c]);
}
