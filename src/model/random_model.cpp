#include "model/random_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <thread>

#include "util/error.h"

namespace forja::model {

namespace {

// SplitMix64's output function: a counter-based generator (value i of stream s is
// mix(s + i * golden)), so any element range can be made on its own, in parallel, and the
// result does not depend on how the work was split.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
uint64_t draw(uint64_t stream, uint64_t i) { return mix(stream + (i + 1) * kGolden); }

uint64_t derive_seed(uint64_t seed, std::string_view what) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name, then mixed with the seed
  for (char ch : what) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return mix(seed ^ mix(h));
}

// Runs body(begin, end) over [0, n) on the machine's cores when n is large.
template <typename Body>
void parallel_for(int64_t n, Body&& body) {
  const int64_t min_per_thread = int64_t(1) << 18;
  const int64_t threads =
      std::clamp<int64_t>(n / min_per_thread, 1, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    body(int64_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = t * per, end = std::min(n, begin + per);
    if (begin < end) pool.emplace_back([&body, begin, end] { body(begin, end); });
  }
  for (auto& th : pool) th.join();
}

// Hugging Face's initializer_range for these models.
constexpr float kInitStd = 0.02f;

class RandomSource : public BaseWeightSource {
 public:
  explicit RandomSource(uint64_t seed) : seed_(seed) {}
  void open(const TensorSpec&) override {}
  void read(const TensorSpec& t, int64_t first, std::span<float> out) override {
    switch (t.role) {
      case TensorRole::norm:
        std::fill(out.begin(), out.end(), 1.0f);
        return;
      case TensorRole::bias:
        std::fill(out.begin(), out.end(), 0.0f);
        return;
      case TensorRole::embedding:
      case TensorRole::lm_head:
      case TensorRole::linear:
        random_normal(derive_seed(seed_, t.name), first, out, kInitStd);
        return;
    }
  }
  quant::Nf4Tensor read_nf4(const TensorSpec& t, const quant::Nf4Options& options) override {
    return random_nf4_tensor(t.shape, derive_seed(seed_, t.name), options.double_quant);
  }

 private:
  uint64_t seed_;
};

ModelConfig qwen3(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t head_dim, int64_t vocab, bool tied, int64_t max_positions) {
  ModelConfig c;
  c.architecture = Architecture::Qwen3;
  c.model_type = "qwen3";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.max_position_embeddings = max_positions;
  c.tie_word_embeddings = tied;
  c.qk_norm = true;
  c.torch_dtype = "bfloat16";
  return c;
}

}  // namespace

const std::vector<std::string>& bench_shape_names() {
  static const std::vector<std::string> names = {"tiny", "qwen3-0.6b", "qwen3-4b", "qwen3-8b"};
  return names;
}

ModelConfig bench_shape_config(std::string_view name) {
  // The released Qwen3 configs (config.json of Qwen/Qwen3-0.6B, -4B, -8B); tiny is ours.
  if (name == "tiny") return qwen3(64, 128, 2, 4, 2, 16, 512, true, 4096);
  if (name == "qwen3-0.6b") return qwen3(1024, 3072, 28, 16, 8, 128, 151936, true, 40960);
  if (name == "qwen3-4b") return qwen3(2560, 9728, 36, 32, 8, 128, 151936, true, 40960);
  if (name == "qwen3-8b") return qwen3(4096, 12288, 36, 32, 8, 128, 151936, false, 40960);
  std::string list;
  for (const std::string& n : bench_shape_names()) list += (list.empty() ? "" : ", ") + n;
  throw UserError("--shape " + std::string(name) + ": unknown shape; choose one of " + list);
}

void random_normal(uint64_t seed, int64_t first, std::span<float> out, float stddev) {
  const int64_t n = static_cast<int64_t>(out.size());
  parallel_for(n, [&](int64_t begin, int64_t end) {
    // Box-Muller: pair p gives elements 2p (cosine) and 2p + 1 (sine) from one 64-bit draw.
    for (int64_t i = begin; i < end; ++i) {
      const int64_t e = first + i;
      const uint64_t bits = draw(seed, static_cast<uint64_t>(e / 2));
      const double u1 = (double(bits >> 32) + 0.5) * 0x1p-32;  // (0, 1): log is finite
      const double u2 = double(bits & 0xffffffffu) * 0x1p-32;
      const double r = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * std::numbers::pi * u2;
      out[static_cast<size_t>(i)] = static_cast<float>(stddev * r * (e % 2 == 0 ? std::cos(angle) : std::sin(angle)));
    }
  });
}

quant::Nf4Tensor random_nf4_tensor(const std::vector<int64_t>& shape, uint64_t seed, bool double_quant) {
  quant::Nf4Tensor t;
  t.shape = shape;
  t.numel = 1;
  for (int64_t d : shape) t.numel *= d;
  t.packed.resize(static_cast<size_t>((t.numel + 1) / 2));
  const uint64_t code_stream = mix(seed ^ 1), absmax_stream = mix(seed ^ 2);
  const int64_t words = (static_cast<int64_t>(t.packed.size()) + 7) / 8;
  parallel_for(words, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      uint64_t bits = draw(code_stream, static_cast<uint64_t>(w));
      for (int64_t k = w * 8; k < std::min<int64_t>((w + 1) * 8, static_cast<int64_t>(t.packed.size())); ++k) {
        t.packed[static_cast<size_t>(k)] = static_cast<uint8_t>(bits);
        bits >>= 8;
      }
    }
  });
  if (t.numel % 2 == 1) {
    uint8_t& last = t.packed.back();
    last = static_cast<uint8_t>((last & 0xf0) | 7);  // the padding nibble holds the code of 0.0
  }
  std::vector<float> absmax(static_cast<size_t>(t.num_blocks()));
  for (size_t b = 0; b < absmax.size(); ++b) {
    const double u = double(draw(absmax_stream, b) >> 11) * 0x1p-53;  // [0, 1)
    absmax[b] = static_cast<float>(0.02 * (2.2 + 0.6 * u));
  }
  quant::store_block_absmax(t, std::move(absmax), double_quant);
  return t;
}

BaseWeights random_base_weights(gpu::Context& ctx, const ModelConfig& config, const BaseWeightOptions& options,
                                uint64_t seed) {
  RandomSource source(seed);
  return build_base_weights(ctx, source, config, options);
}

TokenBatch random_token_batch(uint32_t batch, uint32_t seq, int64_t vocab, uint64_t seed) {
  TokenBatch b;
  b.batch = batch;
  b.seq = seq;
  const uint64_t stream = derive_seed(seed, "token batch");
  const size_t n = size_t(batch) * seq;
  b.input_ids.resize(n);
  for (size_t i = 0; i < n; ++i)
    b.input_ids[i] = static_cast<int32_t>(draw(stream, i) % static_cast<uint64_t>(vocab));
  for (uint32_t r = 0; r < batch; ++r)
    for (uint32_t s = 0; s < seq; ++s) {
      const size_t i = size_t(r) * seq + s;
      b.targets.push_back(s + 1 < seq ? b.input_ids[i + 1] : -100);
      b.positions.push_back(static_cast<int32_t>(s));
      b.segments.push_back(1);
    }
  return b;
}

}  // namespace forja::model
