// Token choice (model/sampler.h) and streaming detokenisation (data/text_stream.h), on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "data/text_stream.h"
#include "data/tokenizer_fixtures.h"
#include "model/sampler.h"
#include "util/error.h"

namespace forja::test {
namespace {

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f, 0.0f};

TEST(Sampler, GreedyTakesTheFirstLargest) {
  model::Sampler s({}, 0);
  EXPECT_EQ(s.next(kLogits), 1);
}

TEST(Sampler, SameSeedSameSamplesOtherSeedOthers) {
  model::Sampler a({1.0, 0, 1.0}, 42), b({1.0, 0, 1.0}, 42), c({1.0, 0, 1.0}, 43);
  std::vector<int32_t> xa, xb, xc;
  for (int i = 0; i < 50; ++i) {
    xa.push_back(a.next(kLogits));
    xb.push_back(b.next(kLogits));
    xc.push_back(c.next(kLogits));
  }
  EXPECT_EQ(xa, xb);
  EXPECT_NE(xa, xc);
}

// Frequencies follow softmax(logits / T) restricted by top-k and top-p.
TEST(Sampler, FrequenciesFollowTheWarpedSoftmax) {
  struct Case {
    model::SamplingSettings s;
    std::vector<double> p;  // expected probabilities by id
  };
  auto softmax = [](std::vector<int> keep, double t) {
    std::vector<double> p(kLogits.size(), 0.0);
    double sum = 0;
    for (int i : keep) sum += p[i] = std::exp(kLogits[i] / t);
    for (double& x : p) x /= sum;
    return p;
  };
  const std::vector<Case> cases = {
      {{1.0, 0, 1.0}, softmax({0, 1, 2, 3, 4, 5}, 1.0)},
      {{0.5, 0, 1.0}, softmax({0, 1, 2, 3, 4, 5}, 0.5)},
      {{1.0, 3, 1.0}, softmax({1, 4, 3}, 1.0)},  // ties at 2.0: both kept, then 1.0
      {{1.0, 0, 0.6}, softmax({1, 4}, 1.0)},     // 1 and 4 hold 0.32 each: together >= 0.6
      {{1.0, 0, 0.1}, softmax({1}, 1.0)},        // at least the most likely token
  };
  for (const Case& c : cases) {
    model::Sampler s(c.s, 5);
    std::vector<double> freq(kLogits.size(), 0.0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) freq[s.next(kLogits)] += 1.0 / n;
    for (size_t i = 0; i < freq.size(); ++i)
      EXPECT_NEAR(freq[i], c.p[i], 0.01) << "T " << c.s.temperature << " k " << c.s.top_k << " p " << c.s.top_p
                                         << " token " << i;
  }
}

TEST(Sampler, RejectsBadSettings) {
  EXPECT_THROW(model::Sampler({-1.0, 0, 1.0}, 0), UserError);
  EXPECT_THROW(model::Sampler({1.0, -2, 1.0}, 0), UserError);
  EXPECT_THROW(model::Sampler({1.0, 0, 0.0}, 0), UserError);
  EXPECT_THROW(model::Sampler({1.0, 0, 1.5}, 0), UserError);
}

// Streaming the tokens of text with multi-byte characters split across byte-level tokens gives
// the text back piece by piece, never a replacement character.
TEST(TextStream, NeverSplitsACharacter) {
  const data::Tokenizer& tok = data::test::real_tokenizer("qwen3");
  const std::string text = "Grüße, 世界! Rare: 𠜎𠜱 🫠🦩 ꙮ naïve café — ok<|im_end|>";
  const std::vector<int32_t> ids = tok.encode(text);
  data::TextStream stream(tok, /*skip_special=*/false);
  std::string out;
  int held = 0;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "replacement character after token " << id;
    held += piece.empty();
    out += piece;
  }
  out += stream.flush();
  EXPECT_EQ(out, text);
  EXPECT_GT(held, 0);  // some characters did span several tokens
  data::TextStream skipping(tok);
  std::string plain;
  for (int32_t id : ids) plain += skipping.push(id);
  EXPECT_EQ(plain + skipping.flush(), "Grüße, 世界! Rare: 𠜎𠜱 🫠🦩 ꙮ naïve café — ok");
}

}  // namespace
}  // namespace forja::test
