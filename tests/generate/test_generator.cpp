// The KV-cache generator (model/generator.h) against the PyTorch reference and against itself:
// prefill logits equal the reference's (fp32 engine, dense base, with and without a LoRA
// adapter); feeding tokens one at a time, in uneven chunks, or after truncating the cache gives
// the same logits as one prefill; greedy generation is deterministic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "generate/generate_cases.h"
#include "io/safetensors.h"
#include "model/generator.h"
#include "app/loaded_model.h"
#include "model/lora.h"
#include "model/sampler.h"
#include "support/gpu_fixture.h"

namespace forja::test {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> prompt_ids(const fs::path& dir) {
  return read_json(dir / "prompt.json").at("ids").get<std::vector<int32_t>>();
}

// max |got - want| / max |want| (norm-wise, as tests/reference/compare.py).
double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return diff / scale;
}

class GeneratorCase : public GpuTest, public ::testing::WithParamInterface<std::string> {
 protected:
  fs::path dir() const { return generate_cases_dir() / GetParam(); }
};

TEST_P(GeneratorCase, PrefillLogitsMatchReference) {
  app::LoadedModel m(ctx(), dir() / "model", {.quant = model::BaseQuant::none});
  const auto lora = model::load_adapter(ctx(), m.config, dir() / "adapter");
  const std::vector<int32_t> ids = prompt_ids(dir());
  const io::SafetensorsFile ref = io::SafetensorsFile::open(dir() / "logits.safetensors");
  for (bool adapter : {false, true}) {
    SCOPED_TRACE(adapter ? "with adapter" : "base");
    // chunks of 16: the prompt of 37 tokens spans three, the last one partial
    model::Generator gen(ctx(), m.base, adapter ? lora.get() : nullptr, 64, 16);
    const std::vector<float> logits = gen.forward(ids, true);
    EXPECT_LT(max_rel(logits, ref.tensor(adapter ? "adapter" : "base").to_float()), 1e-4);
    EXPECT_EQ(gen.position(), ids.size());
  }
}

TEST_P(GeneratorCase, StepByStepDecodingEqualsPrefill) {
  app::LoadedModel m(ctx(), dir() / "model", {.quant = model::BaseQuant::none});
  const auto lora = model::load_adapter(ctx(), m.config, dir() / "adapter");
  const std::vector<int32_t> ids = prompt_ids(dir());
  const size_t V = static_cast<size_t>(m.config.vocab_size);
  model::Generator whole(ctx(), m.base, lora.get(), 40, 256);
  const std::vector<float> all = whole.forward(ids, true);
  const std::vector<float> last = std::vector<float>(all.end() - V, all.end());

  // The last-position logits of a prefill equal the last row of the full logits.
  whole.truncate(0);
  EXPECT_LT(max_rel(whole.forward(ids), last), 1e-5);

  // 10 tokens of prefill, then one at a time: each step's logits equal that row of the prefill.
  model::Generator steps(ctx(), m.base, lora.get(), 40, 7);
  std::vector<float> got = steps.forward(std::span(ids.data(), 10));
  EXPECT_LT(max_rel(got, std::vector<float>(all.begin() + 9 * V, all.begin() + 10 * V)), 1e-5);
  for (size_t t = 10; t < ids.size(); ++t) {
    got = steps.forward(std::span(ids.data() + t, 1));
    EXPECT_LT(max_rel(got, std::vector<float>(all.begin() + t * V, all.begin() + (t + 1) * V)), 1e-5) << "token " << t;
  }
  // Truncating the cache and feeding a different continuation overwrites the old keys.
  steps.truncate(20);
  EXPECT_EQ(steps.position(), 20u);
  std::vector<int32_t> other(ids.begin() + 20, ids.end());
  std::reverse(other.begin(), other.end());
  const std::vector<float> branch = steps.forward(other);
  std::vector<int32_t> fresh_ids(ids.begin(), ids.begin() + 20);
  fresh_ids.insert(fresh_ids.end(), other.begin(), other.end());
  model::Generator fresh(ctx(), m.base, lora.get(), 40, 256);
  EXPECT_LT(max_rel(branch, fresh.forward(fresh_ids)), 1e-5);
}

TEST_P(GeneratorCase, GreedyIsDeterministicAndSamplingFollowsTheSeed) {
  app::LoadedModel m(ctx(), dir() / "model", {.quant = model::BaseQuant::nf4});
  const std::vector<int32_t> all_ids = prompt_ids(dir());
  const std::vector<int32_t> prompt(all_ids.begin(), all_ids.begin() + 9);
  auto run = [&](const model::SamplingSettings& s, uint64_t seed) {
    model::Generator gen(ctx(), m.base, nullptr, 64);
    model::Sampler sampler(s, seed);
    std::vector<int32_t> streamed;
    const int32_t stop[1] = {-1};
    auto r = model::generate(
        gen, prompt, 12, stop, [&](std::span<const float> l) { return sampler.next(l); },
        [&](int32_t t) { streamed.push_back(t); });
    EXPECT_EQ(r.tokens, streamed);
    EXPECT_EQ(r.reason, model::StopReason::max_tokens);
    EXPECT_EQ(gen.position(), prompt.size() + 11);  // the last token is not fed
    return r.tokens;
  };
  const auto greedy = run({}, 1);
  EXPECT_EQ(greedy.size(), 12u);
  EXPECT_EQ(run({}, 2), greedy);
  const model::SamplingSettings hot{1.5, 0, 1.0};
  const auto a = run(hot, 7), b = run(hot, 7), c = run(hot, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, greedy);

  // Greedy tokens are the argmax of the logits after the prompt and what it generated.
  model::Generator check(ctx(), m.base, nullptr, 64);
  std::vector<int32_t> seq = prompt;
  std::vector<float> logits = check.forward(prompt);
  for (int32_t t : greedy) {
    EXPECT_EQ(t, std::max_element(logits.begin(), logits.end()) - logits.begin());
    logits = check.forward(std::span(&t, 1));
  }
}

TEST_P(GeneratorCase, StopsAtAnEndToken) {
  app::LoadedModel m(ctx(), dir() / "model", {.quant = model::BaseQuant::none});
  const std::vector<int32_t> prompt = prompt_ids(dir());
  model::Generator gen(ctx(), m.base, nullptr, 64);
  model::Sampler sampler({}, 0);
  auto choose = [&](std::span<const float> l) { return sampler.next(l); };
  const auto first = model::generate(gen, prompt, 5, {}, choose, nullptr);
  gen.truncate(0);
  const int32_t stop[1] = {first.tokens[2]};
  const auto r = model::generate(gen, prompt, 5, stop, choose, nullptr);
  EXPECT_EQ(r.reason, model::StopReason::eos);
  EXPECT_EQ(r.tokens.size(),
            size_t(std::find(first.tokens.begin(), first.tokens.end(), stop[0]) - first.tokens.begin()) + 1);
}

std::string case_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

INSTANTIATE_TEST_SUITE_P(Cases, GeneratorCase, ::testing::Values("qwen3", "qwen2-bias", "llama-rope"), case_name);

}  // namespace
}  // namespace forja::test
