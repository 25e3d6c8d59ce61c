// Attention against a KV cache (generation) vs the double-precision reference: awkward head
// sizes, GQA, contexts that span several key tiles, prefill chunks and single tokens, sentinels
// after the output; and a chunk's queries answer as if each were decoded alone.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ops/cached_attention.h"
#include "ops/ref/cached_attention_ref.h"
#include "support/gpu_buffers.h"

namespace forja::test {
namespace {

class CachedAttentionTest : public GpuBufferTest {
 protected:
  CachedAttentionTest() : GpuBufferTest(23, -2.0f, 2.0f) {}
};

struct Case {
  uint32_t queries, first_pos, n_heads, n_kv_heads, head_dim;
};

TEST_F(CachedAttentionTest, MatchesReference) {
  for (Case c : {Case{1, 0, 1, 1, 1}, Case{1, 0, 3, 1, 16}, Case{7, 0, 3, 1, 16}, Case{1, 200, 4, 2, 128},
                 Case{5, 129, 6, 3, 10}, Case{1, 255, 8, 8, 64}, Case{13, 300, 4, 1, 128}, Case{2, 1, 2, 2, 127},
                 Case{1, 1000, 16, 2, 2}}) {
    SCOPED_TRACE("queries " + std::to_string(c.queries) + " first_pos " + std::to_string(c.first_pos) + " heads " +
                 std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " d " + std::to_string(c.head_dim));
    const uint32_t positions = c.first_pos + c.queries;
    const size_t nq = size_t(c.queries) * c.n_heads * c.head_dim, nkv = size_t(positions) * c.n_kv_heads * c.head_dim;
    auto q = random(nq), k = random(nkv), v = random(nkv);
    auto gq = upload(q), gk = upload(k), gv = upload(v), go = output(nq);
    const double scale = 1.0 / std::sqrt(double(c.head_dim));
    ops::cached_attention(ctx(), gq, gk, gv, go, c.queries, c.first_pos, c.n_heads, c.n_kv_heads, c.head_dim,
                          static_cast<float>(scale));
    std::vector<double> want(nq);
    ref::cached_attention(want.data(), to_double(q).data(), to_double(k).data(), to_double(v).data(), c.queries,
                          c.first_pos, c.n_heads, c.n_kv_heads, c.head_dim, double(static_cast<float>(scale)));
    expect_close(result(go, nq), want, 2e-5);
  }
}

// Scores far from zero (softmax dominated by a few keys): the online rescaling must not overflow.
TEST_F(CachedAttentionTest, LargeScoresStayFinite) {
  const uint32_t queries = 3, first_pos = 140, nh = 4, nkv = 2, d = 32, positions = first_pos + queries;
  const size_t nq = size_t(queries) * nh * d, nkv_n = size_t(positions) * nkv * d;
  auto q = random(nq, -30.0f, 30.0f), k = random(nkv_n, -30.0f, 30.0f), v = random(nkv_n);
  auto gq = upload(q), gk = upload(k), gv = upload(v), go = output(nq);
  ops::cached_attention(ctx(), gq, gk, gv, go, queries, first_pos, nh, nkv, d, 1.0f);
  std::vector<double> want(nq);
  ref::cached_attention(want.data(), to_double(q).data(), to_double(k).data(), to_double(v).data(), queries, first_pos,
                        nh, nkv, d, 1.0);
  expect_close(result(go, nq), want, 2e-5);
}

// The last query of a chunk equals the same query decoded alone at its position.
TEST_F(CachedAttentionTest, ChunkEqualsSingleQueries) {
  const uint32_t queries = 9, first_pos = 20, nh = 6, nkv = 2, d = 24, positions = first_pos + queries;
  const size_t row = size_t(nh) * d, nq = queries * row, nkv_n = size_t(positions) * nkv * d;
  auto q = random(nq), k = random(nkv_n), v = random(nkv_n);
  auto gq = upload(q), gk = upload(k), gv = upload(v), go = output(nq);
  ops::cached_attention(ctx(), gq, gk, gv, go, queries, first_pos, nh, nkv, d, 0.2f);
  const auto chunk = result(go, nq);
  for (uint32_t t = 0; t < queries; ++t) {
    auto g1 = upload(std::vector<float>(q.begin() + t * row, q.begin() + (t + 1) * row)), o1 = output(row);
    ops::cached_attention(ctx(), g1, gk, gv, o1, 1, first_pos + t, nh, nkv, d, 0.2f);
    const auto single = result(o1, row);
    for (size_t i = 0; i < row; ++i) EXPECT_EQ(single[i], chunk[t * row + i]) << "query " << t << " element " << i;
  }
}

}  // namespace
}  // namespace forja::test
