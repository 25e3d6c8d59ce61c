// `forja merge` (model/merge.h): merged projections against a double-precision W + scale * B A
// rounded to the output dtype, every other tensor bit-exact, config and tokenizer files copied,
// NF4 merges against dequant(NF4(W)), sharding and the index, rsLoRA, dtype conversion, the
// atomic output directory and the errors for mismatched inputs; then the CLI, and the PyTorch
// reference reading the result with its own safetensors reader.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "io/adapter.h"
#include "io/file_helpers.h"
#include "io/float16.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/merge.h"
#include "quant/nf4.h"
#include "support/cli_runner.h"

namespace forja::model {
namespace {

namespace fs = std::filesystem;

// Awkward sizes: 3 heads of 16 over hidden 48, 1 KV head, intermediate 80, vocab 97.
std::string tiny_config(bool tied, const std::string& torch_dtype, int hidden = 48) {
  return R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": )" +
         std::to_string(hidden) + R"(, "intermediate_size": 80,
  "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 16,
  "vocab_size": 97, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "max_position_embeddings": 128,
  "hidden_act": "silu", "tie_word_embeddings": )" +
         (tied ? "true" : "false") + R"(, "torch_dtype": ")" + torch_dtype +
         R"(", "use_cache": true, "bos_token_id": 1, "eos_token_id": 2})";
}

struct SourceTensor {
  io::Dtype dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
  std::vector<double> values() const {
    std::vector<double> out(bytes.size() / io::dtype_size(dtype));
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (dtype == io::Dtype::F32) {
        float f;
        std::memcpy(&f, bytes.data() + 4 * i, 4);
        out[i] = f;
      } else {
        std::uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = dtype == io::Dtype::BF16 ? io::bf16_to_float(h) : io::f16_to_float(h);
      }
    }
    return out;
  }
};

struct TinyModel {
  ModelConfig config;
  std::map<std::string, SourceTensor> tensors;
};

const std::map<std::string, std::string>& tokenizer_files() {
  static const std::map<std::string, std::string> files = {
      {"tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"model_max_length": 128})"},
      {"generation_config.json", R"({"do_sample": true, "temperature": 0.6})"},
      {"chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}\n"},
      {"merges.txt", "#version: 0.2\nh e\n"}};
  return files;
}

TinyModel write_model(const fs::path& dir, io::Dtype dtype, bool tied, std::uint32_t seed,
                      bool lm_head_too = false, int hidden = 48) {
  fs::create_directories(dir);
  const char* torch_dtype = dtype == io::Dtype::F32 ? "float32" : "bfloat16";
  const std::string config_text = tiny_config(tied, torch_dtype, hidden);
  test::write_bytes(dir / "config.json", config_text);
  TinyModel m;
  m.config = parse_model_config(config_text, "config.json");
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<ExpectedTensor> expected = expected_tensors(m.config);
  if (tied && lm_head_too) expected.push_back({"lm_head.weight", {97, hidden}});
  std::vector<io::TensorToWrite> writes;
  for (const ExpectedTensor& t : expected) {
    SourceTensor s{dtype, t.shape, {}};
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    s.bytes.resize(static_cast<std::size_t>(n) * io::dtype_size(dtype));
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = normal(rng) + (t.shape.size() == 1 ? 1.0f : 0.0f);  // norms near 1
      if (dtype == io::Dtype::F32) {
        std::memcpy(s.bytes.data() + 4 * i, &v, 4);
      } else {
        const std::uint16_t h = io::float_to_bf16(v);
        std::memcpy(s.bytes.data() + 2 * i, &h, 2);
      }
    }
    m.tensors[t.name] = std::move(s);
  }
  for (const auto& [name, s] : m.tensors)
    writes.push_back({name, s.dtype, s.shape, std::span<const std::byte>(s.bytes), {}});
  io::write_safetensors_sharded(dir, writes);
  for (const auto& [name, text] : tokenizer_files()) test::write_bytes(dir / name, text);
  return m;
}

io::Adapter write_adapter(const fs::path& dir, const ModelConfig& config, std::int64_t r,
                          double alpha, bool rslora, std::vector<std::string> targets,
                          std::uint32_t seed) {
  io::Adapter a;
  a.config.r = r;
  a.config.lora_alpha = alpha;
  a.config.use_rslora = rslora;
  a.config.target_modules = targets;
  const io::LoraTargetShapes shapes = lora_target_shapes(config);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ua(-0.5f, 0.5f);
  std::normal_distribution<float> nb(0.0f, 0.05f);
  for (std::int64_t layer = 0; layer < config.num_layers; ++layer)
    for (const io::LoraTarget& t : shapes.targets) {
      if (std::find(targets.begin(), targets.end(), t.name) == targets.end()) continue;
      io::LoraWeights w;
      w.layer = layer;
      w.target = t.name;
      for (std::int64_t i = 0; i < r * t.in_features; ++i) w.a.push_back(ua(rng));
      for (std::int64_t i = 0; i < t.out_features * r; ++i) w.b.push_back(nb(rng));
      a.weights.push_back(std::move(w));
    }
  io::save_adapter(dir, a, shapes);
  return a;
}

const std::vector<std::string> kAll = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                       "gate_proj", "up_proj", "down_proj"};

// Orders the bit patterns of same-format floats so that neighbours differ by 1.
std::int64_t ordered(std::uint32_t bits, int width) {
  const std::uint32_t sign = 1u << (width - 1);
  return (bits & sign) ? -static_cast<std::int64_t>(bits & (sign - 1))
                       : static_cast<std::int64_t>(bits);
}

// The bits of `v` correctly rounded to `dtype`, found by comparing the two candidates around it
// exactly (independent of merge.cpp's round-to-odd).
std::uint32_t exact_round(double v, io::Dtype dtype) {
  if (dtype == io::Dtype::F32) return std::bit_cast<std::uint32_t>(static_cast<float>(v));
  const float f = static_cast<float>(v);  // within one float ulp of v; bracket it in 16 bits
  auto widen = [&](std::uint16_t h) {
    return dtype == io::Dtype::BF16 ? double(io::bf16_to_float(h)) : double(io::f16_to_float(h));
  };
  const std::uint16_t near =
      dtype == io::Dtype::BF16 ? io::float_to_bf16(f) : io::float_to_f16(f);
  std::uint16_t best = near;
  double best_err = std::fabs(widen(near) - v);
  for (int d : {-1, 1}) {
    const std::uint16_t c = static_cast<std::uint16_t>(near + d);
    const double err = std::fabs(widen(c) - v);
    if (std::isfinite(widen(c)) && (err < best_err || (err == best_err && (c & 1) == 0))) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

struct Comparison {
  std::int64_t elements = 0, exact = 0, max_ulps = 0;
};

// Compares a merged output tensor with the double-precision W + scale * B A.
Comparison compare_target(const io::TensorView& got, const std::vector<double>& w,
                          const io::LoraWeights& lw, std::int64_t r, double scale) {
  Comparison c;
  const std::int64_t out = got.shape()[0], in = got.shape()[1];
  const int width = got.dtype() == io::Dtype::F32 ? 32 : 16;
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) {
      double delta = 0.0;
      for (std::int64_t k = 0; k < r; ++k)
        delta += double(lw.b[o * r + k]) * double(lw.a[k * in + i]);
      const double want = w[o * in + i] + scale * delta;
      const std::uint32_t ref = exact_round(want, got.dtype());
      std::uint32_t bits = 0;
      std::memcpy(&bits, got.bytes().data() + (o * in + i) * (width / 8), width / 8);
      const std::int64_t ulps = std::llabs(ordered(bits, width) - ordered(ref, width));
      c.elements++;
      c.exact += ulps == 0;
      c.max_ulps = std::max(c.max_ulps, ulps);
    }
  return c;
}

std::string linear_weight_name(std::int64_t layer, const std::string& target) {
  for (LinearKind k : kAllLinears)
    if (target == linear_name(k)) return linear_path(layer, k) + ".weight";
  return "";
}

// Checks every tensor of `out` against the model and adapter; `base` gives the W the merge
// used for a target (the source values, or their NF4 round trip).
void check_merged(const fs::path& out, const TinyModel& m, const io::Adapter& adapter,
                  double scale, std::optional<io::Dtype> dtype,
                  const std::function<std::vector<double>(const std::string&)>& base = {}) {
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(out);
  const std::vector<std::string> listed = ck.names();
  std::set<std::string> names(listed.begin(), listed.end()), want;
  for (const auto& [name, t] : m.tensors) want.insert(name);
  EXPECT_EQ(names, want);
  std::set<std::string> targets;
  Comparison total;
  for (const io::LoraWeights& lw : adapter.weights) {
    const std::string name = linear_weight_name(lw.layer, lw.target);
    targets.insert(name);
    const SourceTensor& src = m.tensors.at(name);
    const io::TensorView got = ck.tensor(name);
    EXPECT_EQ(got.dtype(), dtype.value_or(src.dtype)) << name;
    EXPECT_EQ(got.shape(), src.shape) << name;
    const Comparison c =
        compare_target(got, base ? base(name) : src.values(), lw, adapter.config.r, scale);
    EXPECT_LE(c.max_ulps, 1) << name;
    total.elements += c.elements;
    total.exact += c.exact;
    total.max_ulps = std::max(total.max_ulps, c.max_ulps);
  }
  // Ties that a float cannot tell apart are the only way to be off by one: all but a handful
  // must be the correctly rounded value itself.
  EXPECT_GE(total.exact, total.elements - std::max<std::int64_t>(2, total.elements / 10000))
      << total.exact << " of " << total.elements;
  for (const auto& [name, src] : m.tensors) {
    if (targets.count(name)) continue;
    const io::TensorView got = ck.tensor(name);
    if (!dtype || *dtype == src.dtype) {
      ASSERT_EQ(got.dtype(), src.dtype) << name;
      EXPECT_TRUE(std::equal(src.bytes.begin(), src.bytes.end(), got.bytes().begin(),
                             got.bytes().end()))
          << name << " is not bit-exact";
    } else {
      ASSERT_EQ(got.dtype(), *dtype) << name;
      const std::vector<double> v = src.values();
      for (std::size_t i = 0; i < v.size(); ++i) {
        float f;
        got.to_float(std::span<float>(&f, 1), static_cast<std::int64_t>(i));
        std::uint32_t bits = 0;
        std::memcpy(&bits, got.bytes().data() + i * io::dtype_size(*dtype),
                    io::dtype_size(*dtype));
        ASSERT_EQ(bits, exact_round(v[i], *dtype)) << name << "[" << i << "]";
      }
    }
  }
}

void check_side_files(const fs::path& model, const fs::path& out, const std::string& dtype) {
  nlohmann::json a = io::read_json_file(model / "config.json");
  nlohmann::json b = io::read_json_file(out / "config.json");
  EXPECT_EQ(b.at("torch_dtype"), dtype);
  a["torch_dtype"] = dtype;
  EXPECT_EQ(a, b);
  for (const auto& [name, text] : tokenizer_files())
    EXPECT_EQ(io::read_text_file(out / name), text) << name;
}

// Entries of the output's parent other than `keep`: leftovers of the atomic write.
std::vector<std::string> strays(const fs::path& parent, const std::set<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(parent))
    if (!keep.count(e.path().filename().string())) out.push_back(e.path().filename().string());
  return out;
}

TEST(Merge, Bf16AllTargetsMatchDoubleReference) {
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::BF16, true, 1);
  const io::Adapter a = write_adapter(dir / "adapter", m.config, 3, 5.0, false, kAll, 2);
  MergeOptions o{.model_dir = dir / "model", .adapter_dir = dir / "adapter", .out_dir = dir / "out"};
  std::vector<std::string> progress;
  o.progress = [&](const std::string& line) { progress.push_back(line); };
  const MergeSummary s = merge_adapter(o);
  EXPECT_EQ(s.merged, 14);
  EXPECT_EQ(s.copied, static_cast<std::int64_t>(m.tensors.size()) - 14);
  EXPECT_DOUBLE_EQ(s.scale, 5.0 / 3.0);
  EXPECT_EQ(s.weight_files, std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(dir / "out" / "model.safetensors.index.json"));
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), "merged 14/14 projections");
  check_merged(dir / "out", m, a, 5.0 / 3.0, std::nullopt);
  check_side_files(dir / "model", dir / "out", "bfloat16");
  EXPECT_EQ(strays(dir, {"model", "adapter", "out"}), std::vector<std::string>{});
  const auto perms = fs::status(dir / "out").permissions();
  EXPECT_NE(perms & fs::perms::others_read, fs::perms::none) << "not the mode of a plain mkdir";
}

TEST(Merge, F32UntiedSubsetOfTargets) {
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::F32, false, 3);
  const io::Adapter a =
      write_adapter(dir / "adapter", m.config, 5, 16.0, false, {"q_proj", "v_proj", "down_proj"}, 4);
  const MergeSummary s = merge_adapter(
      {.model_dir = dir / "model", .adapter_dir = dir / "adapter", .out_dir = dir / "out"});
  EXPECT_EQ(s.merged, 6);
  EXPECT_EQ(s.torch_dtype, "float32");
  check_merged(dir / "out", m, a, 16.0 / 5.0, std::nullopt);
  check_side_files(dir / "model", dir / "out", "float32");
}

TEST(Merge, RsLoraScale) {
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::F32, true, 5);
  const io::Adapter a = write_adapter(dir / "adapter", m.config, 4, 3.0, true, {"o_proj", "up_proj"}, 6);
  const MergeSummary s = merge_adapter(
      {.model_dir = dir / "model", .adapter_dir = dir / "adapter", .out_dir = dir / "out"});
  EXPECT_DOUBLE_EQ(s.scale, 1.5);  // 3 / sqrt(4), not 3 / 4
  check_merged(dir / "out", m, a, 1.5, std::nullopt);
  // The plain alpha / r scale would not match: the check above can tell the two apart.
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir / "out");
  const std::string name = "model.layers.1.self_attn.o_proj.weight";
  const Comparison wrong = compare_target(ck.tensor(name), m.tensors.at(name).values(),
                                          a.weights[2], 4, 0.75);
  EXPECT_LT(wrong.exact, wrong.elements / 2);
}

TEST(Merge, FromNf4EqualsDequantisedBasePlusDelta) {
  for (bool dq : {true, false}) {
    SCOPED_TRACE(dq ? "double quant" : "fp32 absmax");
    const fs::path dir = test::scratch_dir();
    const TinyModel m = write_model(dir / "model", io::Dtype::BF16, true, 7);
    const io::Adapter a = write_adapter(dir / "adapter", m.config, 2, 4.0, false, kAll, 8);
    merge_adapter({.model_dir = dir / "model",
                   .adapter_dir = dir / "adapter",
                   .out_dir = dir / "out",
                   .base = MergeBase::nf4,
                   .double_quant = dq,
                   .threads = 3});
    auto nf4_base = [&](const std::string& name) {
      const SourceTensor& src = m.tensors.at(name);
      const std::vector<double> v = src.values();
      const std::vector<float> f(v.begin(), v.end());
      const quant::Nf4Tensor q = quant::nf4_quantize(f, src.shape, {.double_quant = dq, .threads = 1});
      const std::vector<float> d = quant::nf4_dequantize(q);
      return std::vector<double>(d.begin(), d.end());
    };
    check_merged(dir / "out", m, a, 2.0, std::nullopt, nf4_base);
    // and it is not the merge into the original weights
    const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(dir / "out");
    const std::string name = "model.layers.0.mlp.gate_proj.weight";
    const Comparison original =
        compare_target(ck.tensor(name), m.tensors.at(name).values(), a.weights[4], 2, 2.0);
    EXPECT_LT(original.exact, original.elements / 2);
  }
}

TEST(Merge, ShardsWithIndexAndSameTensors) {
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::BF16, true, 9, /*lm_head_too=*/true);
  const io::Adapter a = write_adapter(dir / "adapter", m.config, 3, 6.0, false, kAll, 10);
  merge_adapter({.model_dir = dir / "model", .adapter_dir = dir / "adapter", .out_dir = dir / "one"});
  const MergeSummary s = merge_adapter({.model_dir = dir / "model",
                                        .adapter_dir = dir / "adapter",
                                        .out_dir = dir / "sharded",
                                        .max_shard_bytes = 20'000});
  ASSERT_GT(s.weight_files.size(), 3u);
  EXPECT_EQ(s.weight_files.back(), "model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(dir / "sharded" / "model.safetensors"));
  const nlohmann::json index = io::read_json_file(dir / "sharded" / "model.safetensors.index.json");
  const io::SafetensorsCheckpoint one = io::SafetensorsCheckpoint::open(dir / "one");
  const io::SafetensorsCheckpoint sharded = io::SafetensorsCheckpoint::open(dir / "sharded");
  EXPECT_EQ(index.at("weight_map").size(), m.tensors.size());
  EXPECT_EQ(index.at("metadata").at("total_size").get<std::uint64_t>(), s.tensor_bytes);
  EXPECT_EQ(sharded.total_tensor_bytes(), s.tensor_bytes);
  const std::size_t shards = s.weight_files.size() - 1;
  EXPECT_EQ(sharded.files().size(), shards);
  for (const io::SafetensorsFile& f : sharded.files()) {
    std::uint64_t bytes = 0;
    for (const io::TensorInfo& t : f.tensors()) {
      bytes += t.byte_size();
      EXPECT_EQ(index.at("weight_map").at(t.name), f.path().filename().string());
    }
    EXPECT_TRUE(bytes <= 20'000 || f.tensors().size() == 1) << f.path();
    char expected_name[64];
    std::snprintf(expected_name, sizeof expected_name, "-of-%05zu.safetensors", shards);
    EXPECT_TRUE(f.path().filename().string().ends_with(expected_name)) << f.path();
  }
  for (const std::string& name : one.names()) {
    const auto x = one.tensor(name).bytes(), y = sharded.tensor(name).bytes();
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << name;
  }
  check_merged(dir / "sharded", m, a, 2.0, std::nullopt);
  check_side_files(dir / "model", dir / "sharded", "bfloat16");
}

TEST(Merge, OutputDtypeConversion) {
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::BF16, true, 11);
  const io::Adapter a = write_adapter(dir / "adapter", m.config, 3, 3.0, false, kAll, 12);
  for (io::Dtype d : {io::Dtype::F32, io::Dtype::F16}) {
    const fs::path out = dir / io::dtype_name(d);
    const MergeSummary s = merge_adapter({.model_dir = dir / "model",
                                          .adapter_dir = dir / "adapter",
                                          .out_dir = out,
                                          .dtype = d});
    const std::string name = d == io::Dtype::F32 ? "float32" : "float16";
    EXPECT_EQ(s.torch_dtype, name);
    check_merged(out, m, a, 1.0, d);
    check_side_files(dir / "model", out, name);
  }
}

TEST(Merge, Float16OverflowIsRefused) {
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::F32, true, 13);
  // A norm weight of 1e5 fits bf16 and f32 but not f16.
  std::map<std::string, SourceTensor> tensors = m.tensors;
  const float big = 1e5f;
  std::memcpy(tensors.at("model.norm.weight").bytes.data(), &big, 4);
  std::vector<io::TensorToWrite> writes;
  for (const auto& [name, s] : tensors)
    writes.push_back({name, s.dtype, s.shape, std::span<const std::byte>(s.bytes), {}});
  io::write_safetensors_sharded(dir / "model", writes);
  write_adapter(dir / "adapter", m.config, 2, 2.0, false, {"q_proj"}, 14);
  const std::string msg = test::user_error_of([&] {
    merge_adapter({.model_dir = dir / "model",
                   .adapter_dir = dir / "adapter",
                   .out_dir = dir / "out",
                   .dtype = io::Dtype::F16});
  });
  EXPECT_NE(msg.find("'model.norm.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--dtype bf16"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_EQ(strays(dir, {"model", "adapter"}), std::vector<std::string>{});
}

TEST(Merge, RefusesNonEmptyOutputAndReplacesOnlyWhenComplete) {
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::BF16, true, 15);
  const io::Adapter a = write_adapter(dir / "adapter", m.config, 2, 2.0, false, kAll, 16);
  const MergeOptions base{.model_dir = dir / "model", .adapter_dir = dir / "adapter",
                          .out_dir = dir / "out"};
  fs::create_directories(dir / "out");
  test::write_bytes(dir / "out" / "notes.txt", "mine");
  MergeOptions o = base;
  std::string msg = test::user_error_of([&] { merge_adapter(o); });
  EXPECT_NE(msg.find("--out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  o.overwrite = true;  // still refused: not a model directory
  msg = test::user_error_of([&] { merge_adapter(o); });
  EXPECT_NE(msg.find("no config.json"), std::string::npos) << msg;
  EXPECT_EQ(io::read_text_file(dir / "out" / "notes.txt"), "mine");
  EXPECT_EQ(strays(dir, {"model", "adapter", "out"}), std::vector<std::string>{});

  // An empty directory is simply filled; a model directory is replaced with --overwrite.
  fs::remove_all(dir / "out");
  fs::create_directories(dir / "out");
  merge_adapter(base);
  check_merged(dir / "out", m, a, 1.0, std::nullopt);
  test::write_bytes(dir / "out" / "stale.txt", "old");
  msg = test::user_error_of([&] { merge_adapter(base); });
  EXPECT_NE(msg.find("not empty"), std::string::npos) << msg;
  // A failing merge with --overwrite leaves the old output alone.
  o = base;
  o.overwrite = true;
  o.dtype = io::Dtype::F16;
  {
    // Make it fail late: a tensor beyond f16's range (written after the output dir exists).
    std::map<std::string, SourceTensor> tensors = m.tensors;
    const std::uint16_t big = io::float_to_bf16(1e6f);
    std::memcpy(tensors.at("model.norm.weight").bytes.data(), &big, 2);
    std::vector<io::TensorToWrite> writes;
    for (const auto& [name, s] : tensors)
      writes.push_back({name, s.dtype, s.shape, std::span<const std::byte>(s.bytes), {}});
    io::write_safetensors_sharded(dir / "model2", writes);
    fs::copy_file(dir / "model" / "config.json", dir / "model2" / "config.json");
    o.model_dir = dir / "model2";
  }
  msg = test::user_error_of([&] { merge_adapter(o); });
  EXPECT_NE(msg.find("float16"), std::string::npos) << msg;
  EXPECT_EQ(io::read_text_file(dir / "out" / "stale.txt"), "old");
  check_merged(dir / "out", m, a, 1.0, std::nullopt);
  EXPECT_EQ(strays(dir, {"model", "model2", "adapter", "out"}), std::vector<std::string>{});

  o = base;
  o.overwrite = true;
  merge_adapter(o);
  EXPECT_FALSE(fs::exists(dir / "out" / "stale.txt"));
  check_merged(dir / "out", m, a, 1.0, std::nullopt);
  EXPECT_EQ(strays(dir, {"model", "model2", "adapter", "out"}), std::vector<std::string>{});

  o.out_dir = dir / "model";  // never the input itself
  msg = test::user_error_of([&] { merge_adapter(o); });
  EXPECT_NE(msg.find("model or adapter directory itself"), std::string::npos) << msg;
}

TEST(Merge, MismatchedInputsNameTheProblem) {
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::BF16, true, 17);
  const TinyModel other = write_model(dir / "other", io::Dtype::BF16, true, 17, false, 64);
  write_adapter(dir / "adapter64", other.config, 2, 2.0, false, kAll, 18);
  const MergeOptions base{.model_dir = dir / "model", .adapter_dir = dir / "adapter64",
                          .out_dir = dir / "out"};
  std::string msg = test::user_error_of([&] { merge_adapter(base); });
  EXPECT_NE(msg.find("'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has "
                     "shape [2, 64]"),
            std::string::npos)
      << msg;

  MergeOptions o = base;
  o.adapter_dir = dir / "missing";
  msg = test::user_error_of([&] { merge_adapter(o); });
  EXPECT_NE(msg.find("adapter_config.json: not found"), std::string::npos) << msg;
  o = base;
  o.model_dir = dir / "nothing";
  msg = test::user_error_of([&] { merge_adapter(o); });
  EXPECT_NE(msg.find("nothing: not found; --model"), std::string::npos) << msg;

  // A checkpoint whose projection disagrees with its own config.json.
  write_adapter(dir / "adapter", m.config, 2, 2.0, false, kAll, 19);
  std::vector<io::TensorToWrite> writes;
  std::vector<std::vector<std::byte>> keep;
  keep.reserve(m.tensors.size());  // the spans below point into it
  for (const auto& [name, s] : m.tensors) {
    std::vector<std::int64_t> shape = s.shape;
    if (name == "model.layers.1.mlp.up_proj.weight") shape[0] -= 1;
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    keep.emplace_back(s.bytes.begin(), s.bytes.begin() + n * 2);
    writes.push_back({name, s.dtype, shape, std::span<const std::byte>(keep.back()), {}});
  }
  fs::create_directories(dir / "bad");
  io::write_safetensors_sharded(dir / "bad", writes);
  fs::copy_file(dir / "model" / "config.json", dir / "bad" / "config.json");
  o = base;
  o.model_dir = dir / "bad";
  o.adapter_dir = dir / "adapter";
  msg = test::user_error_of([&] { merge_adapter(o); });
  EXPECT_NE(msg.find("'model.layers.1.mlp.up_proj.weight' has shape [79, 48]"), std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(MergeRounding, SixteenBitRoundingIsCorrectWhereDoubleRoundingIsNot) {
  // 1 + 2^-8 + 2^-30: float rounds it to the bf16 tie 1 + 2^-8, which then goes to even (1.0);
  // the correctly rounded bf16 is 1 + 2^-7.
  const double v = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(io::float_to_bf16(static_cast<float>(v)), 0x3f80);
  EXPECT_EQ(round_to_bf16(v), 0x3f81);
  EXPECT_EQ(round_to_bf16(-v), 0xbf81);
  // The same for f16 (10 mantissa bits): 1 + 2^-11 + 2^-40.
  const double h = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(io::float_to_f16(static_cast<float>(h)), 0x3c00);
  EXPECT_EQ(round_to_f16(h), 0x3c01);
  // Exact ties still go to even; overflow and tiny values.
  EXPECT_EQ(round_to_bf16(1.0 + std::ldexp(1.0, -8)), 0x3f80);
  EXPECT_EQ(round_to_f16(65519.0), 0x7bff);
  EXPECT_EQ(round_to_f16(65520.0), 0x7c00);
  EXPECT_EQ(round_to_bf16(std::ldexp(1.0, -140)), io::float_to_bf16(std::ldexp(1.0f, -140)));
  EXPECT_EQ(round_to_bf16(1e-300), 0x0000);
  EXPECT_EQ(round_to_bf16(-1e-300), 0x8000);
  // Random doubles near bf16/f16 ties against the exact bracket search.
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> u(-4.0, 4.0);
  for (int i = 0; i < 200000; ++i) {
    double x = u(rng);
    if (i % 2) {  // a tie of bf16 nudged by a few double ulps
      const double tie = double(io::bf16_to_float(io::float_to_bf16(float(x)))) +
                         std::ldexp(1.0, std::ilogb(x) - 8);
      x = tie + std::ldexp(double((i % 7) - 3), std::ilogb(x) - 50);
    }
    ASSERT_EQ(round_to_bf16(x), exact_round(x, io::Dtype::BF16)) << x;
    ASSERT_EQ(round_to_f16(x), exact_round(x, io::Dtype::F16)) << x;
  }
}

TEST(MergeOptionsParsing, ByteSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "--max-shard-size"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB", "--max-shard-size"), 500'000'000u);
  EXPECT_EQ(parse_byte_size("2GiB", "--max-shard-size"), 2147483648u);
  EXPECT_EQ(parse_byte_size("10kb", "--max-shard-size"), 10'000u);
  EXPECT_EQ(parse_byte_size("1.5GB", "--max-shard-size"), 1'500'000'000u);
  EXPECT_EQ(parse_byte_size("4096", "--max-shard-size"), 4096u);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0", "1..5GB"}) {
    const std::string msg =
        test::user_error_of([&] { parse_byte_size(bad, "--max-shard-size"); });
    EXPECT_NE(msg.find("--max-shard-size"), std::string::npos) << bad;
  }
}

// ---- the command line, and the PyTorch reference reading the output ----

using forja::test::program;

std::pair<int, std::string> run(const std::string& cmd) {
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int status = ::pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(MergeCli, MergesRefusesAndReportsBadFlags) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path dir = test::scratch_dir();
  const TinyModel m = write_model(dir / "model", io::Dtype::BF16, true, 23);
  const io::Adapter a = write_adapter(dir / "adapter", m.config, 3, 6.0, false, kAll, 24);
  const std::string args = " merge --model " + (dir / "model").string() + " --adapter " +
                           (dir / "adapter").string() + " --out " + (dir / "out").string();
  auto [rc, out] = run(program() + args + " --max-shard-size 30KB");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("merged 14 projections (r 3, scale 2, from original)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("model.safetensors.index.json"), std::string::npos) << out;
  check_merged(dir / "out", m, a, 2.0, std::nullopt);
  std::tie(rc, out) = run(program() + args);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("exists and is not empty"), std::string::npos) << out;
  std::tie(rc, out) = run(program() + args + " --overwrite --from nf4 --double-quant off");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("from nf4"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "out" / "model.safetensors.index.json"));  // old one replaced
  std::tie(rc, out) = run(program() + args + "2 --max-shard-size 5XB");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--max-shard-size \"5XB\""), std::string::npos) << out;
}

TEST(MergeCli, PytorchReferenceAgrees) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  if (run("/usr/bin/python3 -c 'import torch'").first != 0)
    GTEST_SKIP() << "/usr/bin/python3 with torch is not available";
  const fs::path dir = test::scratch_dir();
  const std::string ref = std::string(FORJA_SOURCE_DIR) + "/tests/reference/";
  // The model from the reference's own writer (qwen2: q/k/v biases), the adapter from forja's.
  auto [rc, out] = run("/usr/bin/python3 " + ref + "make_model.py --family qwen2 --seed 3 " +
                       "--dtype BF16 --out " + (dir / "model").string());
  ASSERT_EQ(rc, 0) << out;
  const ModelConfig config = load_model_config(dir / "model");
  write_adapter(dir / "adapter", config, 4, 7.0, true, {"q_proj", "k_proj", "o_proj", "up_proj"},
                25);
  std::tie(rc, out) = run(program() + " merge --model " + (dir / "model").string() +
                          " --adapter " + (dir / "adapter").string() + " --out " +
                          (dir / "out").string() + " --max-shard-size 40KB");
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = run("/usr/bin/python3 " + ref + "merge_check.py --model " +
                          (dir / "model").string() + " --adapter " + (dir / "adapter").string() +
                          " --merged " + (dir / "out").string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("PASS"), std::string::npos) << out;
}

}  // namespace
}  // namespace forja::model
