// Tests of the attention reference: finite differences of the backward, GQA against explicitly
// repeated kv heads, segment masking against per-segment runs, and a hand-sized example.
#include "ops/ref/attention_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops_ref/fd_check.h"

namespace forja::ref {
namespace {

using test::fd_check;
using test::random_vec;

struct Shape {
  int64_t batch, seq, nh, nkv, d;
  int64_t q_size() const { return batch * seq * nh * d; }
  int64_t kv_size() const { return batch * seq * nkv * d; }
};

void check_attention_backward(const Shape& s, const std::vector<int32_t>* segments, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> q = random_vec(rng, s.q_size(), -1.5, 1.5);
  std::vector<double> k = random_vec(rng, s.kv_size(), -1.5, 1.5);
  std::vector<double> v = random_vec(rng, s.kv_size());
  const std::vector<double> dout = random_vec(rng, s.q_size());
  const int32_t* seg = segments ? segments->data() : nullptr;
  std::vector<double> out(s.q_size()), lse(s.batch * s.seq * s.nh);
  std::vector<double> dq(s.q_size()), dk(s.kv_size()), dv(s.kv_size());
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg, s.batch, s.seq, s.nh,
                    s.nkv, s.d);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                     out.data(), lse.data(), seg, s.batch, s.seq, s.nh, s.nkv, s.d);
  std::vector<double> o2(out.size()), l2(lse.size());
  auto loss = [&] {
    attention_forward(o2.data(), l2.data(), q.data(), k.data(), v.data(), seg, s.batch, s.seq, s.nh,
                      s.nkv, s.d);
    return test::dot(dout, o2);
  };
  EXPECT_FD_OK(fd_check(q, dq, loss));
  EXPECT_FD_OK(fd_check(k, dk, loss));
  EXPECT_FD_OK(fd_check(v, dv, loss));
}

TEST(RefAttention, BackwardMatchesFiniteDifferencesGqaOneKvHead) {
  check_attention_backward({2, 11, 3, 1, 6}, nullptr, 20);
}

TEST(RefAttention, BackwardMatchesFiniteDifferencesGqaTwoKvHeads) {
  check_attention_backward({1, 9, 4, 2, 5}, nullptr, 21);
}

TEST(RefAttention, BackwardMatchesFiniteDifferencesWithSegments) {
  // Two sequences of 11: packed segments, a padding tail (0), a segment id reused in batch 1.
  const std::vector<int32_t> seg = {1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 0,  //
                                    5, 5, 5, 5, 5, 1, 1, 1, 1, 1, 1};
  check_attention_backward({2, 11, 3, 1, 6}, &seg, 22);
}

TEST(RefAttention, HandExampleTwoTokens) {
  // One head, d = 1, scale = 1. Token 0 sees only itself; token 1 sees both keys.
  const std::vector<double> q = {0.3, 2.0}, k = {1.0, -0.5}, v = {4.0, 10.0};
  std::vector<double> out(2), lse(2);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, 1, 2, 1, 1, 1);
  EXPECT_NEAR(out[0], 4.0, 1e-15);
  EXPECT_NEAR(lse[0], 0.3, 1e-15);
  const double s0 = 2.0 * 1.0, s1 = 2.0 * -0.5;
  const double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1));
  EXPECT_NEAR(out[1], p0 * 4.0 + (1 - p0) * 10.0, 1e-14);
  EXPECT_NEAR(lse[1], std::log(std::exp(s0) + std::exp(s1)), 1e-14);
}

TEST(RefAttention, ScaleIsHeadDimPowMinusHalf) {
  // Two tokens, d = 4, keys differ: the softmax weight reveals the scale.
  const int64_t d = 4;
  std::vector<double> q(2 * d, 0.0), k(2 * d, 0.0), v(2 * d, 0.0);
  q[d] = 1.0;  // query of token 1 = e0
  k[0] = 3.0;  // key 0 = 3 e0 -> score 3 * 0.5
  v[0] = 1.0;  // v0 = e0, v1 = 0
  std::vector<double> out(2 * d), lse(2);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, 1, 2, 1, 1, d);
  const double e = std::exp(1.5);
  EXPECT_NEAR(out[d], e / (e + 1.0), 1e-15);
}

TEST(RefAttention, GqaEqualsRepeatedKvHeads) {
  // nh = 6, nkv = 2: query heads 0-2 read kv head 0, 3-5 read kv head 1 (repeat_kv), so running
  // with the kv heads repeated to 6 gives the same output, and dk/dv are the sums over the
  // repeated copies.
  std::mt19937_64 rng(23);
  const int64_t B = 2, S = 7, nh = 6, nkv = 2, d = 5, rep = nh / nkv;
  const std::vector<double> q = random_vec(rng, B * S * nh * d);
  const std::vector<double> k = random_vec(rng, B * S * nkv * d);
  const std::vector<double> v = random_vec(rng, B * S * nkv * d);
  const std::vector<double> dout = random_vec(rng, B * S * nh * d);
  std::vector<double> kr(B * S * nh * d), vr(B * S * nh * d);
  for (int64_t t = 0; t < B * S; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t c = 0; c < d; ++c) {
        kr[(t * nh + h) * d + c] = k[(t * nkv + h / rep) * d + c];
        vr[(t * nh + h) * d + c] = v[(t * nkv + h / rep) * d + c];
      }
    }
  }
  std::vector<double> out(q.size()), lse(B * S * nh), out_r(q.size()), lse_r(B * S * nh);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, B, S, nh, nkv,
                    d);
  attention_forward(out_r.data(), lse_r.data(), q.data(), kr.data(), vr.data(), nullptr, B, S, nh,
                    nh, d);
  EXPECT_LT(test::max_rel_diff(out, out_r), 1e-14);
  EXPECT_LT(test::max_rel_diff(lse, lse_r), 1e-14);
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<double> dq_r(q.size()), dk_r(kr.size()), dv_r(vr.size());
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                     out.data(), lse.data(), nullptr, B, S, nh, nkv, d);
  attention_backward(dq_r.data(), dk_r.data(), dv_r.data(), dout.data(), q.data(), kr.data(),
                     vr.data(), out_r.data(), lse_r.data(), nullptr, B, S, nh, nh, d);
  EXPECT_LT(test::max_rel_diff(dq, dq_r), 1e-13);
  std::vector<double> dk_sum(k.size(), 0.0), dv_sum(v.size(), 0.0);
  for (int64_t t = 0; t < B * S; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t c = 0; c < d; ++c) {
        dk_sum[(t * nkv + h / rep) * d + c] += dk_r[(t * nh + h) * d + c];
        dv_sum[(t * nkv + h / rep) * d + c] += dv_r[(t * nh + h) * d + c];
      }
    }
  }
  EXPECT_LT(test::max_rel_diff(dk, dk_sum), 1e-13);
  EXPECT_LT(test::max_rel_diff(dv, dv_sum), 1e-13);
}

TEST(RefAttention, SegmentsEqualSeparateRuns) {
  // One packed row of 11 tokens: documents [0,3) id 4, [3,7) id 2, [7,9) id 9, then two
  // padding tokens (id 0). Each document must behave exactly as if run alone.
  std::mt19937_64 rng(24);
  const int64_t S = 11, nh = 3, nkv = 1, d = 6;
  const std::vector<int32_t> seg = {4, 4, 4, 2, 2, 2, 2, 9, 9, 0, 0};
  const std::vector<std::pair<int64_t, int64_t>> docs = {{0, 3}, {3, 7}, {7, 9}};
  const std::vector<double> q = random_vec(rng, S * nh * d), k = random_vec(rng, S * nkv * d),
                            v = random_vec(rng, S * nkv * d), dout = random_vec(rng, S * nh * d);
  std::vector<double> out(q.size()), lse(S * nh);
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg.data(), 1, S, nh, nkv,
                    d);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                     out.data(), lse.data(), seg.data(), 1, S, nh, nkv, d);
  for (const auto& doc : docs) {
    const int64_t b = doc.first, e = doc.second;  // not a structured binding: clang 14 cannot capture one
    const int64_t n = e - b;
    auto slice = [&](const std::vector<double>& a, int64_t heads) {
      return std::vector<double>(a.begin() + b * heads * d, a.begin() + e * heads * d);
    };
    const auto qs = slice(q, nh), ks = slice(k, nkv), vs = slice(v, nkv), ds = slice(dout, nh);
    std::vector<double> os(qs.size()), ls(n * nh), dqs(qs.size()), dks(ks.size()), dvs(vs.size());
    attention_forward(os.data(), ls.data(), qs.data(), ks.data(), vs.data(), nullptr, 1, n, nh, nkv,
                      d);
    attention_backward(dqs.data(), dks.data(), dvs.data(), ds.data(), qs.data(), ks.data(),
                       vs.data(), os.data(), ls.data(), nullptr, 1, n, nh, nkv, d);
    EXPECT_LT(test::max_rel_diff(slice(out, nh), os), 1e-14) << "doc at " << b;
    EXPECT_LT(
        test::max_rel_diff(std::vector<double>(lse.begin() + b * nh, lse.begin() + e * nh), ls),
        1e-14);
    EXPECT_LT(test::max_rel_diff(slice(dq, nh), dqs), 1e-13);
    EXPECT_LT(test::max_rel_diff(slice(dk, nkv), dks), 1e-13);
    EXPECT_LT(test::max_rel_diff(slice(dv, nkv), dvs), 1e-13);
  }
  // Padding rows: zero output, -inf lse, no gradient in or out.
  for (int64_t i = 9; i < S; ++i) {
    for (int64_t h = 0; h < nh; ++h) {
      EXPECT_EQ(lse[i * nh + h], -std::numeric_limits<double>::infinity());
      for (int64_t c = 0; c < d; ++c) {
        EXPECT_EQ(out[(i * nh + h) * d + c], 0.0);
        EXPECT_EQ(dq[(i * nh + h) * d + c], 0.0);
      }
    }
    for (int64_t c = 0; c < nkv * d; ++c) {
      EXPECT_EQ(dk[i * nkv * d + c], 0.0);
      EXPECT_EQ(dv[i * nkv * d + c], 0.0);
    }
  }
}

TEST(RefAttention, SameSegmentIdMeansSameDocument) {
  // The mask compares ids, not boundaries: ids [1,1,2,1] let token 3 see tokens 0 and 1.
  // (Documented behaviour: give each packed document its own id.)
  const int64_t d = 2;
  const std::vector<int32_t> seg = {1, 1, 2, 1};
  std::vector<double> q(4 * d, 0.0), k(4 * d, 0.0), v = {1, 0, 2, 0, 100, 0, 3, 0};
  std::vector<double> out(4 * d), lse(4);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg.data(), 1, 4, 1, 1,
                    d);
  EXPECT_NEAR(out[3 * d], (1.0 + 2.0 + 3.0) / 3.0, 1e-15);  // uniform over tokens 0, 1, 3
  EXPECT_NEAR(out[2 * d], 100.0, 1e-15);                    // token 2 sees only itself
}

TEST(RefAttention, RejectsHeadsNotMultipleOfKvHeads) {
  std::vector<double> buf(64);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                                 nullptr, 1, 1, 3, 2, 4),
               std::invalid_argument);
}

}  // namespace
}  // namespace forja::ref
