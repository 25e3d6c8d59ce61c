// What the fused attention kernels (flash_forward_khr.comp, flash_backward_khr.comp) share:
// their 16x16 fragments, the staging of fp16 rows into shared memory, the segment ranges of a
// tile. Included after the kernel declares its specialization constants WARPS, HD, ROW_SHIFT,
// COL_SHIFT, its constants NT (invocations), CH (uvec4 chunks per row) and LD (staged row
// stride), its push constants pc (with pc.seq), its segment buffer seg[] and `shared uvec4 sh[]`.
//
// Fragments: subgroup-scope cooperative matrices 16x16x16, fp16 operands, fp32 accumulators. The
// kernels work on an accumulator's elements by row and column in the lane pattern of NVIDIA's
// m16n8k16 accumulator: lane l holds rows l/4 and l/4 + 8, columns 2 (l % 4) + {0, 1} and those +
// 8; element i is in row half (i >> ROW_SHIFT) & 1 and column half (i >> COL_SHIFT) & 1 (the
// host's probe reads which, ops/attention_gemm.cpp).
//
// EMULATE: the same kernels without cooperative matrices, WARPS emulated subgroups of 32 lanes
// per workgroup (lanes 32 w ... 32 w + 31 of the workgroup's invocations are subgroup w's,
// whatever the device's subgroup size; every kernel runs WARPS 1 but the backward's dq from dS
// with QUAD, which runs 4, and the forward with PINGPONG, which runs 2): every fragment (A, B
// and accumulator) is the lane's 8 elements in that pattern, fp16 values held in floats;
// products and the row exchanges go through shared memory, with barriers, so every subgroup of
// the workgroup makes the same calls. Slow, and exact to fp32 accumulation in another order, for
// tests on any device.

// The kernels' loops over fragments: unrolled for the registers; kept as loops in the emulation,
// whose shared-memory products would otherwise grow the shader past what lavapipe compiles quickly.
#if defined(EMULATE)
#define UNROLL [[dont_unroll]]
#define LANE (gl_LocalInvocationIndex & 31u)
#define WARP (gl_LocalInvocationIndex >> 5u)
#define FRAG_A float[8]
#define FRAG_B float[8]
#define FRAG_C float[8]
#define C_ZERO float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
#define A_ZERO C_ZERO
#define ROW_MAJOR false
#define COL_MAJOR true
#define LOAD(m, off, major) m = emu_load(off, LD, major)
#define LOAD_LD(m, off, ld, major) m = emu_load(off, ld, major)
#define MMA(a, b, c) emu_mma(a, b, c)
#define TO_A(x) emu_round_f16(x)
#define SHUFFLE_XOR(x, mask) emu_shuffle_xor(x, mask)
#else
#define UNROLL [[unroll]]
#define LANE gl_SubgroupInvocationID
#define WARP gl_SubgroupID
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define C_ZERO FRAG_C(0.0)
#define A_ZERO FRAG_A(0.0)
#define ROW_MAJOR gl_CooperativeMatrixLayoutRowMajor
#define COL_MAJOR gl_CooperativeMatrixLayoutColumnMajor
// A 16x16 fp16 fragment from sh[off...]: row-major rows (column-major columns) of LD chunks.
#define LOAD(m, off, major) coopMatLoad(m, sh, off, LD, major)
#define LOAD_LD(m, off, ld, major) coopMatLoad(m, sh, off, ld, major)
#define MMA(a, b, c) coopMatMulAdd(a, b, c)
#define TO_A(x) FRAG_A(x)  // NV cooperative matrix 2: accumulator to A, rounded to fp16
#define SHUFFLE_XOR(x, mask) subgroupShuffleXor(x, mask)
#endif

// Row and column of element i of this lane's fragment (the pattern above).
uint lane_row(uint lane, uint i) { return (lane >> 2u) + 8u * ((i >> ROW_SHIFT) & 1u); }
uint lane_col(uint lane, uint i) { return 2u * (lane & 3u) + (i & 1u) + 8u * ((i >> COL_SHIFT) & 1u); }

// Rows [row0, row0 + rows) of the head whose token-0 row starts at half `first` of an fp16
// [tokens, heads, HD] tensor with `ld` halves per token, copied to sh[at...] (rows of LD chunks);
// rows past the sequence are zero.
#define STAGE(BUF, at, row0, rows, first, ld)                                                        \
  for (uint x = gl_LocalInvocationIndex; x < (rows) * CH; x += NT) {                                 \
    const uint r = x / CH, c = x % CH;                                                              \
    sh[(at) + r * LD + c] = (row0) + r < pc.seq ? BUF[((first) + ((row0) + r) * (ld)) / 8u + c] : uvec4(0u); \
  }

// The range of the nonzero segment ids of positions [first, first + count) (lo > hi when there
// is none) and whether any is padding or past the sequence; the same in every subgroup.
void segment_range(uint sbase, uint first, uint count, out int lo, out int hi, out bool gap) {
  int l = 0x7fffffff, h = -0x7fffffff - 1;
  bool z = false;
  for (uint i = gl_SubgroupInvocationID; i < count; i += gl_SubgroupSize) {
    const uint p = first + i;
    const int s = p < pc.seq ? seg[sbase + p] : 0;
    if (s == 0) {
      z = true;
    } else {
      l = min(l, s);
      h = max(h, s);
    }
  }
  lo = subgroupMin(l);
  hi = subgroupMax(h);
  gap = subgroupAny(z);
}

// The first tile at or after tile j (of `tiles`, `size` positions each) with a visible pair for
// rows whose segments span [lo, hi] (tiles past the causal limit are beyond `tiles`), with its
// segment range; the same in every subgroup.
uint next_visible_tile(uint j, uint tiles, uint size, uint sbase, int lo, int hi, out int tlo, out int thi,
                       out bool tgap) {
  for (; j < tiles; ++j) {
    segment_range(sbase, j * size, size, tlo, thi, tgap);
    if (thi >= lo && tlo <= hi) break;
  }
  return j;
}

#if defined(EMULATE)
// Each emulated subgroup's 16x16 matrices at EMU (256 WARP) and its lanes' values at 32 WARP.
shared float emu_a[256u * WARPS], emu_b[256u * WARPS], emu_x[32u * WARPS];
#define EMU (256u * WARP)

// The lane's elements of the 16x16 fp16 matrix at sh[off...] (lines ld chunks apart), stored as
// LOAD says.
float[8] emu_load(uint off, uint ld, bool col_major) {
  float[8] m;
  [[dont_unroll]] for (uint i = 0u; i < 8u; ++i) {
    const uint r = lane_row(LANE, i), c = lane_col(LANE, i);
    const uint outer = col_major ? c : r, inner = col_major ? r : c;  // stored line, place in it
    const uvec4 w = sh[off + outer * ld + inner / 8u];
    const vec2 h = unpackHalf2x16(w[(inner % 8u) / 2u]);
    m[i] = inner % 2u == 0u ? h.x : h.y;
  }
  return m;
}

// c + a b for the whole 16x16 matrices (every lane of the workgroup calls it together).
float[8] emu_mma(float[8] a, float[8] b, float[8] c) {
  for (uint i = 0u; i < 8u; ++i) {
    const uint at = EMU + lane_row(LANE, i) * 16u + lane_col(LANE, i);
    emu_a[at] = a[i];
    emu_b[at] = b[i];
  }
  barrier();
  for (uint i = 0u; i < 8u; ++i) {
    const uint r = lane_row(LANE, i), col = lane_col(LANE, i);
    float sum = c[i];
    for (uint k = 0u; k < 16u; ++k) sum += emu_a[EMU + r * 16u + k] * emu_b[EMU + k * 16u + col];
    c[i] = sum;
  }
  barrier();
  return c;
}

float[8] emu_round_f16(float[8] x) {
  for (uint i = 0u; i < 8u; ++i) x[i] = unpackHalf2x16(packHalf2x16(vec2(x[i], 0.0))).x;
  return x;
}

float emu_shuffle_xor(float x, uint mask) {
  emu_x[32u * WARP + LANE] = x;
  barrier();
  const float y = emu_x[32u * WARP + (LANE ^ mask)];
  barrier();
  return y;
}
#endif
