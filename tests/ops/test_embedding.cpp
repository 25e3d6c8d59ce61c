// Embedding gather against the double-precision reference (ops/ref/embedding_ref.h): fp32 and
// fp16 tables, awkward widths, out-of-range ids (zero rows, no out-of-bounds reads), sentinels
// after the output, and a table larger than the binding limit where that limit is small.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <random>
#include <string>

#include "io/float16.h"
#include "ops/embedding.h"
#include "ops/ref/embedding_ref.h"
#include "support/gpu_buffers.h"

namespace forja::test {
namespace {

class EmbeddingTest : public GpuBufferTest {
 protected:
  EmbeddingTest() : GpuBufferTest(5, -3.0f, 3.0f) {}
  // Uploads the table in `dtype`; rounds it in place to the values the GPU holds.
  gpu::Buffer upload_table(std::vector<float>& table, ops::DType dtype) {
    if (dtype == ops::DType::f32) return upload(table, 0.0f);
    std::vector<uint16_t> h(table.size());
    for (size_t i = 0; i < table.size(); ++i) {
      h[i] = io::float_to_f16(table[i]);
      table[i] = io::f16_to_float(h[i]);
    }
    return upload(h, uint16_t{0});
  }
};

// The reference for ids that may be out of range: zero rows there (the op's contract).
std::vector<double> expected(const std::vector<float>& table, const std::vector<int32_t>& ids, uint32_t vocab,
                             uint32_t hidden) {
  std::vector<int32_t> valid(ids);
  for (auto& id : valid)
    if (id < 0 || uint32_t(id) >= vocab) id = 0;
  std::vector<double> td(table.begin(), table.end()), y(ids.size() * hidden);
  ref::embedding_forward(y.data(), valid.data(), td.data(), int64_t(ids.size()), vocab, hidden);
  for (size_t t = 0; t < ids.size(); ++t)
    if (valid[t] != ids[t]) std::fill_n(y.begin() + t * hidden, hidden, 0.0);
  return y;
}

TEST_F(EmbeddingTest, GatherMatchesReference) {
  for (ops::DType dt : {ops::DType::f32, ops::DType::f16}) {
    for (uint32_t hidden : {1u, 13u, 129u, 2560u}) {
      for (uint32_t tokens : {1u, 11u, 300u}) {
        SCOPED_TRACE(std::to_string(tokens) + " tokens x " + std::to_string(hidden) +
                     (dt == ops::DType::f16 ? " f16" : " f32"));
        const uint32_t vocab = 1001;
        auto table = random(size_t(vocab) * hidden);
        std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
        std::vector<int32_t> ids(tokens);
        for (auto& id : ids) id = pick(rng_);
        ids[0] = static_cast<int32_t>(vocab - 1);
        if (tokens > 1) ids[1] = 0;
        auto gt = upload_table(table, dt), gi = upload(ids, 0), go = output(size_t(tokens) * hidden);
        ops::embedding_forward(ctx(), gt, dt, gi, go, tokens, hidden, vocab);
        auto want = expected(table, ids, vocab, hidden);
        // A gather is exact: fp16 -> fp32 widening loses nothing.
        auto got = result(go, want.size());
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i)
          if (got[i] != want[i] && bad++ < 5) ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
      }
    }
  }
}

TEST_F(EmbeddingTest, OutOfRangeIdsGiveZeroRows) {
  const uint32_t vocab = 50, hidden = 129;
  auto table = random(size_t(vocab) * hidden);
  const std::vector<int32_t> ids = {3, -1, 50, INT_MAX, INT_MIN, 49, 51, 0};
  const auto tokens = static_cast<uint32_t>(ids.size());
  auto gt = upload_table(table, ops::DType::f16), gi = upload(ids, 0), go = output(size_t(tokens) * hidden);
  ops::embedding_forward(ctx(), gt, ops::DType::f16, gi, go, tokens, hidden, vocab);
  auto want = expected(table, ids, vocab, hidden);
  auto got = result(go, want.size());
  EXPECT_EQ(std::vector<double>(got.begin(), got.end()), want);
}

// A table (and an output) larger than the binding limit: rows on both sides of the chunk
// boundary, odd hidden so chunks start inside a 16-byte word. Only where the limit is small
// enough to test quickly (lavapipe: 128 MiB). Most of the table is filled on the GPU; only the
// rows the ids use are uploaded.
TEST_F(EmbeddingTest, TableLargerThanBindingLimit) {
  const uint64_t limit = ctx().info().max_storage_buffer_range;
  if (limit > (256ull << 20)) GTEST_SKIP() << "binding limit " << limit << " too large to exceed quickly";
  const uint32_t hidden = 2561;
  const auto boundary = static_cast<int32_t>(limit / (2ull * hidden));  // about the first chunk's end
  const auto vocab = static_cast<uint32_t>(boundary) * 3 / 2;           // two chunks
  gpu::Buffer gt = ctx().alloc(uint64_t(vocab) * hidden * 2, "large embedding table");
  bufs_.push_back(gt);
  ctx().fill(gt, 0x3c003c00u);  // every element 1.0 in fp16
  std::vector<int32_t> used = {0, 1, boundary - 3, boundary - 2, boundary - 1, boundary, boundary + 1,
                               boundary + 2, static_cast<int32_t>(vocab) - 1, 12345, -7};
  std::vector<std::vector<float>> used_rows;  // what each id in `used` reads, as fp32
  for (int32_t id : used) {
    std::vector<float> row = random(hidden);
    if (id < 0) {
      used_rows.push_back(std::vector<float>(hidden, 0.0f));
      continue;
    }
    std::vector<uint16_t> h(hidden);
    for (uint32_t c = 0; c < hidden; ++c) {
      h[c] = io::float_to_f16(row[c]);
      row[c] = io::f16_to_float(h[c]);
    }
    if (id == 12345)
      row.assign(hidden, 1.0f);  // a row left as filled
    else
      ctx().upload(gt.slice(uint64_t(id) * hidden * 2, uint64_t(hidden) * 2), h.data(), uint64_t(hidden) * 2);
    used_rows.push_back(row);
  }
  // Enough tokens that out [tokens, hidden] exceeds the limit too. out is NaN-filled on the GPU
  // and read back at every 61st token and around the first token chunk's end.
  const auto token_boundary = static_cast<uint32_t>(limit / (4ull * hidden)), tokens = token_boundary + 3;
  std::vector<int32_t> ids(tokens);
  for (uint32_t t = 0; t < tokens; ++t) ids[t] = used[(t * 7) % used.size()];
  const uint64_t row_bytes = uint64_t(hidden) * 4;
  gpu::Buffer go = ctx().alloc(tokens * row_bytes + kPad * 4, "large embedding output");
  bufs_.push_back(go);
  ctx().fill(go, 0x7fc00000u);  // NaN
  ctx().upload(go.slice(tokens * row_bytes, kPad * 4), std::vector<float>(kPad, kSentinel));
  auto gi = upload(ids, 0);
  ops::embedding_forward(ctx(), gt, ops::DType::f16, gi, go, tokens, hidden, vocab);
  size_t bad = 0;
  for (uint32_t t = 0; t < tokens; ++t) {
    if (t % 61 != 0 && (t + 3 < token_boundary || t > token_boundary + 2)) continue;
    std::vector<float> got(hidden);
    ctx().download(go.slice(t * row_bytes, row_bytes), got.data(), row_bytes);
    const auto& want = used_rows[(t * 7) % used.size()];
    for (uint32_t c = 0; c < hidden; ++c)
      if (got[c] != want[c] && bad++ < 5)
        ADD_FAILURE() << "token " << t << " (id " << ids[t] << ") column " << c << ": " << got[c] << " vs " << want[c];
  }
  EXPECT_EQ(ctx().download<float>(go.slice(tokens * row_bytes, kPad * 4), kPad), std::vector<float>(kPad, kSentinel))
      << "write past the end";
}

TEST_F(EmbeddingTest, RejectsTooSmallBuffers) {
  auto gt = upload(std::vector<float>(100), 0.0f), gi = upload(std::vector<int32_t>(4), 0), go = output(40);
  EXPECT_THROW(ops::embedding_forward(ctx(), gt, ops::DType::f32, gi, go, 4, 10, 1000), std::logic_error);
  EXPECT_THROW(ops::embedding_forward(ctx(), gt, ops::DType::f32, gi, go, 400, 10, 10), std::logic_error);
}

}  // namespace
}  // namespace forja::test
