// The tiled main loop of the scalar GEMMs (gemm.comp, nf4_gemm.comp): fp32 arithmetic,
//   C = alpha * op(A) * op(B) (+ beta * C),  op(A) M x K, op(B) K x N.
//
// A workgroup computes a BM x BN tile of C. Each invocation holds QM x QN register blocks of
// 4x4 accumulators (one vec4 per row of a block): block (qm, qn) of invocation (tx, ty) covers
// rows qm*BM/QM + ty*4 + 0..3 and columns qn*BN/QN + tx*4 + 0..3. Both operand tiles sit in
// shared memory k-major as vec4s (As[k][m/4], Bs[k][n/4]), so one k step of the inner loop is
// QM + QN vec4 shared loads for 16*QM*QN FMAs; the invocations of a subgroup read neighbouring
// (or the same, broadcast) vec4s. Rows are padded by one vec4, which keeps the transposing
// stores (below) free of bank conflicts.
//
// Operands are read in chunks of 4 consecutive elements of a stored row: along k when the
// operand is stored with k contiguous (TA = 0: A [M,K]; TB = 1: B [N,K]; the chunk is then
// scattered over 4 k rows of the shared tile), along m or n otherwise (one vec4 store). K
// advances BK at a time through double-buffered shared tiles: the next tile is fetched into
// registers while the current one is multiplied, then stored to the other stage; one barrier
// per K step.
//
// The including shader defines BM, BN, BK, QM, QN (compile-time: register arrays sized by
// specialization constants ran about 10x slower on NVIDIA's compiler), the constants TA and
// TB, and before including this file:
//   vec4 chunk_a(uint r, uint c)  elements c..c+3 of stored row r of A (TA = 0: row m, elements
//                                 along k; TA = 1: row k, elements along m), zero outside A
//   vec4 chunk_b(uint r, uint c)  likewise for B (TB = 1: row n, along k; TB = 0: row k, along n)
//   void store_c(uint m, uint n, vec4 v)  C[m][n..n+3] from v = the sums, skipping what is
//                                 outside C
// (all three without early returns and without loops over arrays: see tile_chunk_a), and
// calls gemm_tiles(K) from main(); gl_WorkGroupID.xy selects the tile (x along N).

const uint NTX = BN / (4u * QN);  // invocations along N
const uint NTY = BM / (4u * QM);  // along M
const uint NT = NTX * NTY;
const uint RSA = BM / 4u + 1u;    // shared row stride in vec4s (one k row), padded
const uint RSB = BN / 4u + 1u;
// Chunks per stored row of a tile: a tile of A is BM rows of BK (TA = 0) or BK rows of BM.
const uint CA = TA == 0 ? BK / 4u : BM / 4u;
const uint CB = TB == 1 ? BK / 4u : BN / 4u;
// One chunk of A and one of B per invocation per K step: the variants keep BM*BK = BN*BK =
// 4*NT (otherwise the shared arrays below are sized 0, which does not compile).
const uint CHUNKS_OK = BM * BK == 4u * NT && BN * BK == 4u * NT ? 1u : 0u;

shared vec4 As[CHUNKS_OK * 2 * BK * RSA];
shared vec4 Bs[CHUNKS_OK * 2 * BK * RSB];

// Chunk x of the tile of A (B) whose origin is (m0, k0) ((k0, n0)).
// No early returns and no loops over register arrays in this file (nor in the includer's
// helpers): glslc -O then unrolls and scalarises everything but the K loop. A loop left
// rolled that indexes the accumulators makes NVIDIA's compiler keep the whole accumulator
// array in local memory (the likely cause of the first scalar kernel's 2.3 TFLOP/s).
vec4 tile_chunk_a(uint m0, uint k0, uint x) {
  return TA == 0 ? chunk_a(m0 + x / CA, k0 + (x % CA) * 4u) : chunk_a(k0 + x / CA, m0 + (x % CA) * 4u);
}
vec4 tile_chunk_b(uint n0, uint k0, uint x) {
  return TB == 1 ? chunk_b(n0 + x / CB, k0 + (x % CB) * 4u) : chunk_b(k0 + x / CB, n0 + (x % CB) * 4u);
}

// Chunk x into shared stage `s` (k-major): a chunk along k goes to 4 rows, one along m to one.
void store_a(uint s, uint x, vec4 v) {
  const uint base = s * BK * RSA;
  if (TA == 0) {
    const uint m = x / CA, k = (x % CA) * 4u;
    const uint i = base + k * RSA + m / 4u, c = m % 4u;
    As[i][c] = v.x;
    As[i + RSA][c] = v.y;
    As[i + 2u * RSA][c] = v.z;
    As[i + 3u * RSA][c] = v.w;
  } else {
    As[base + (x / CA) * RSA + x % CA] = v;
  }
}
void store_b(uint s, uint x, vec4 v) {
  const uint base = s * BK * RSB;
  if (TB == 1) {
    const uint n = x / CB, k = (x % CB) * 4u;
    const uint i = base + k * RSB + n / 4u, c = n % 4u;
    Bs[i][c] = v.x;
    Bs[i + RSB][c] = v.y;
    Bs[i + 2u * RSB][c] = v.z;
    Bs[i + 3u * RSB][c] = v.w;
  } else {
    Bs[base + (x / CB) * RSB + x % CB] = v;
  }
}

void gemm_tiles(uint K) {
  const uint tid = gl_LocalInvocationIndex;
  const uint tx = tid % NTX, ty = tid / NTX;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint numK = (K + BK - 1u) / BK;

  vec4 acc[QM * 4 * QN];  // acc[(qm*4 + i)*QN + qn]: row qm*BM/QM + ty*4 + i, columns of block qn
  [[unroll]] for (uint i = 0; i < QM * 4u * QN; ++i) acc[i] = vec4(0.0);

  vec4 ra = tile_chunk_a(m0, 0u, tid), rb = tile_chunk_b(n0, 0u, tid);
  store_a(0u, tid, ra);
  store_b(0u, tid, rb);
  barrier();

  uint stage = 0;
  for (uint kt = 0; kt < numK; ++kt) {
    const bool more = kt + 1u < numK;
    if (more) {  // prefetch the next K tile; its latency hides behind the FMAs
      const uint k0 = (kt + 1u) * BK;
      ra = tile_chunk_a(m0, k0, tid);
      rb = tile_chunk_b(n0, k0, tid);
    }
    const uint sa = stage * BK * RSA, sb = stage * BK * RSB;
    [[unroll]] for (uint k = 0; k < BK; ++k) {
      vec4 a[QM], b[QN];
      [[unroll]] for (uint qm = 0; qm < QM; ++qm) a[qm] = As[sa + k * RSA + qm * NTY + ty];
      [[unroll]] for (uint qn = 0; qn < QN; ++qn) b[qn] = Bs[sb + k * RSB + qn * NTX + tx];
      [[unroll]] for (uint qm = 0; qm < QM; ++qm)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
          [[unroll]] for (uint qn = 0; qn < QN; ++qn) {
            const uint t = (qm * 4u + i) * QN + qn;
            acc[t] = fma(vec4(a[qm][i]), b[qn], acc[t]);
          }
    }
    if (more) {
      stage ^= 1u;  // the other stage was last read before the previous barrier
      store_a(stage, tid, ra);
      store_b(stage, tid, rb);
      barrier();
    }
  }

  [[unroll]] for (uint qm = 0; qm < QM; ++qm)
    [[unroll]] for (uint i = 0; i < 4u; ++i)
      [[unroll]] for (uint qn = 0; qn < QN; ++qn)
        store_c(m0 + qm * (BM / QM) + ty * 4u + i, n0 + qn * (BN / QN) + tx * 4u, acc[(qm * 4u + i) * QN + qn]);
}
