// `forja export --format gguf` (model/gguf_export.h). The files are parsed by an independent
// reader (tests/io/gguf_reader.h) and checked against what llama.cpp's converters write (keys,
// types, tensor names, shapes, data, q/k row permutation for Llama, rsLoRA alpha); then a real
// llama.cpp (node-llama-cpp's prebuilt CPU build, third_party/npm-llama-cpp, driven by
// tests/interop/llama_cpp_logits.mjs) loads forja's GGUF base + adapter, and the merged model, and
// its next-token logits at every position are compared with `forja eval --dump-logits` on the
// Hugging Face model + PEFT adapter: f32 within 1e-4, f16 within 2e-2 (f16 rounds every weight).
// The models are forja's tiny Qwen3 example (a real byte-level BPE tokenizer.json; llama.cpp's
// tokenisation of a sentence must equal forja's), the same weights as a Qwen2 with q/k/v biases,
// and as a Llama with llama3 RoPE scaling and an rsLoRA adapter (the permutation and the alpha).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/adapter.h"
#include "io/float16.h"
#include "io/gguf_reader.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "support/cli_runner.h"
#include "train/example.h"

namespace forja::model {
namespace {

namespace fs = std::filesystem;
using test::program;
using json = nlohmann::json;

std::pair<int, std::string> run(const std::string& command) {
  const test::ShellResult r = test::run_shell(command + " 2>&1");
  return {r.exit_code, r.output};
}

std::string forja(const std::string& args) {
  const auto [rc, out] = run(program() + " " + args);
  EXPECT_EQ(rc, 0) << args << "\n" << out;
  return out;
}

// The example Qwen3 and a Llama copy (llama3 rope scaling), each with a random adapter whose B is
// non-zero (the Llama's with rsLoRA), made once per test process.
struct Models {
  fs::path dir, qwen, qwen_adapter, llama, llama_adapter, qwen2, qwen2_adapter;
};
const Models& models() {
  static const Models m = [] {
    Models x;
    x.dir = fs::temp_directory_path() / ("forja_gguf_" + std::to_string(::getpid()));
    fs::remove_all(x.dir);
    x.qwen = x.dir / "qwen3";
    train::ExampleModelShape shape;
    shape.hidden = 64;
    shape.intermediate = 128;
    shape.head_dim = 16;
    train::write_example_model(x.qwen, 7, shape);
    x.llama = x.dir / "llama";
    fs::create_directories(x.llama);
    for (const auto& e : fs::directory_iterator(x.qwen)) fs::copy(e.path(), x.llama / e.path().filename());
    json c = json::parse(io::read_text_file(x.llama / "config.json"));
    c["model_type"] = "llama";
    c["architectures"] = {"LlamaForCausalLM"};
    c["rope_theta"] = 10000.0;
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
    std::ofstream(x.llama / "config.json") << c.dump(2);
    // A Qwen2 of the same weights: no q/k norms, random q/k/v biases (bf16).
    x.qwen2 = x.dir / "qwen2";
    fs::create_directories(x.qwen2);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      fs::copy(x.qwen / f, x.qwen2 / f);
    json c2 = json::parse(io::read_text_file(x.qwen / "config.json"));
    c2["model_type"] = "qwen2";
    c2["architectures"] = {"Qwen2ForCausalLM"};
    std::ofstream(x.qwen2 / "config.json") << c2.dump(2);
    {
      const auto ck = io::SafetensorsCheckpoint::open(x.qwen);
      std::vector<io::TensorToWrite> tensors;
      for (const std::string& name : ck.names())
        if (name.find("_norm.weight") == std::string::npos || name.find("layernorm") != std::string::npos ||
            name == "model.norm.weight")
          tensors.push_back({name, ck.find(name)->dtype, ck.find(name)->shape, ck.tensor(name).bytes(), {}});
      std::vector<std::vector<std::uint16_t>> biases;
      std::uint32_t state = 12345;
      for (int layer = 0; layer < c2["num_hidden_layers"].get<int>(); ++layer)
        for (const char* p : {"q", "k", "v"}) {
          const std::int64_t n = (std::string(p) == "q" ? c2["num_attention_heads"] : c2["num_key_value_heads"])
                                     .get<std::int64_t>() * c2["head_dim"].get<std::int64_t>();
          std::vector<std::uint16_t> b(static_cast<std::size_t>(n));
          for (auto& v : b) {
            state = state * 1664525u + 1013904223u;  // a small LCG: values in [-0.5, 0.5)
            v = io::float_to_bf16(static_cast<float>(state >> 8) / 16777216.0f - 0.5f);
          }
          biases.push_back(std::move(b));
          tensors.push_back({"model.layers." + std::to_string(layer) + ".self_attn." + p + "_proj.bias",
                             io::Dtype::BF16, {n}, std::as_bytes(std::span(biases.back())), {}});
        }
      io::write_safetensors(x.qwen2 / "model.safetensors", std::move(tensors));
    }
    x.qwen2_adapter = x.dir / "qwen2-adapter";
    forja("random-adapter --model " + x.qwen2.string() + " --out " + x.qwen2_adapter.string() +
          " --rank 4 --alpha 8 --seed 5 --b-scale 0.05");
    x.qwen_adapter = x.dir / "qwen3-adapter";
    x.llama_adapter = x.dir / "llama-adapter";
    forja("random-adapter --model " + x.qwen.string() + " --out " + x.qwen_adapter.string() +
          " --rank 4 --alpha 8 --seed 3 --b-scale 0.05");
    forja("random-adapter --model " + x.llama.string() + " --out " + x.llama_adapter.string() +
          " --rank 4 --alpha 8 --seed 4 --b-scale 0.05 --rslora");
    return x;
  }();
  return m;
}

fs::path out_dir() {
  const fs::path d = models().dir / ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(d);
  return d;
}

std::vector<float> peft_factor(const fs::path& adapter, int layer, const std::string& module, char ab) {
  const auto f = io::SafetensorsFile::open(adapter / "adapter_model.safetensors");
  return f.tensor(io::lora_tensor_name(layer, module, ab)).to_float();
}

// Row (h, j, i) of [heads, d/2, 2] <- row (h, i, j) of [heads, 2, d/2] (convert_hf_to_gguf's permute),
// written here independently of the exporter.
std::vector<float> permuted(const std::vector<float>& w, std::int64_t rows, std::int64_t heads) {
  const std::int64_t cols = static_cast<std::int64_t>(w.size()) / rows, d = rows / heads;
  std::vector<float> out(w.size());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < d / 2; ++j)
        for (std::int64_t c = 0; c < cols; ++c)
          out[static_cast<std::size_t>(((h * d) + j * 2 + i) * cols + c)] =
              w[static_cast<std::size_t>(((h * d) + i * (d / 2) + j) * cols + c)];
  return out;
}

TEST(GgufExport, AdapterFileIsWhatConvertLoraToGgufWrites) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const Models& m = models();
  const fs::path out = out_dir();
  forja("export --adapter " + m.qwen_adapter.string() + " --format gguf --out " + (out / "q.gguf").string());
  const test::GgufFile q = test::read_gguf(out / "q.gguf");
  EXPECT_EQ(q.version, 3u);
  EXPECT_EQ(q.key_order.front(), "general.architecture");
  EXPECT_EQ(q.kv.at("general.architecture").s(), "qwen3");
  EXPECT_EQ(q.kv.at("general.type").s(), "adapter");
  EXPECT_EQ(q.kv.at("adapter.type").s(), "lora");
  EXPECT_EQ(q.kv.at("adapter.lora.alpha").type, 6u);  // float32
  EXPECT_EQ(q.kv.at("adapter.lora.alpha").f(), 8.0);
  EXPECT_EQ(q.tensors.size(), 2u * 7u * 2u);  // 2 layers, 7 projections, A and B
  const ModelConfig c = load_model_config(m.qwen);
  const std::map<std::string, std::string> names = {
      {"self_attn.q_proj", "attn_q"},  {"self_attn.k_proj", "attn_k"}, {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  for (int layer = 0; layer < 2; ++layer)
    for (const auto& [module, gguf] : names) {
      const std::string base = "blk." + std::to_string(layer) + "." + gguf + ".weight";
      const test::GgufTensorInfo* a = q.tensor(base + ".lora_a");
      const test::GgufTensorInfo* b = q.tensor(base + ".lora_b");
      ASSERT_TRUE(a && b) << base;
      const std::vector<float> pa = peft_factor(m.qwen_adapter, layer, module, 'A');
      const std::vector<float> pb = peft_factor(m.qwen_adapter, layer, module, 'B');
      const std::uint64_t r = 4, in = pa.size() / r, outf = pb.size() / r;
      EXPECT_EQ(a->ne, (std::vector<std::uint64_t>{in, r})) << base;  // lora_A [r, in]
      EXPECT_EQ(b->ne, (std::vector<std::uint64_t>{r, outf})) << base;  // lora_B [out, r]
      EXPECT_EQ(a->type, 0u);
      EXPECT_EQ(q.floats(base + ".lora_a"), pa) << base;
      EXPECT_EQ(q.floats(base + ".lora_b"), pb) << base;  // Qwen: no permutation
    }

  // Llama: lora_B of q/k permuted per head; rsLoRA's alpha / sqrt(r) as alpha' / r.
  forja("export --adapter " + m.llama_adapter.string() + " --out " + (out / "l.gguf").string() + " --dtype f16");
  const test::GgufFile l = test::read_gguf(out / "l.gguf");
  EXPECT_EQ(l.kv.at("general.architecture").s(), "llama");
  EXPECT_NEAR(l.kv.at("adapter.lora.alpha").f(), 8.0 * std::sqrt(4.0), 1e-5);
  EXPECT_EQ(l.tensor("blk.1.attn_q.weight.lora_b")->type, 1u);  // f16
  const std::vector<float> qb = peft_factor(m.llama_adapter, 1, "self_attn.q_proj", 'B');
  const std::vector<float> kb = peft_factor(m.llama_adapter, 1, "self_attn.k_proj", 'B');
  const std::vector<float> vb = peft_factor(m.llama_adapter, 1, "self_attn.v_proj", 'B');
  auto near_all = [](const std::vector<float>& got, const std::vector<float>& want) {
    if (got.size() != want.size()) return false;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (std::fabs(got[i] - want[i]) > 1e-3f * std::fabs(want[i]) + 1e-7f) return false;
    return true;
  };
  EXPECT_TRUE(near_all(l.floats("blk.1.attn_q.weight.lora_b"), permuted(qb, c.num_heads * c.head_dim, c.num_heads)));
  EXPECT_TRUE(near_all(l.floats("blk.1.attn_k.weight.lora_b"), permuted(kb, c.num_kv_heads * c.head_dim, c.num_kv_heads)));
  EXPECT_TRUE(near_all(l.floats("blk.1.attn_v.weight.lora_b"), vb));
  EXPECT_FALSE(near_all(l.floats("blk.1.attn_q.weight.lora_b"), qb)) << "q's rows were not permuted";
}

TEST(GgufExport, ModelFileHasWhatLlamaCppNeeds) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const Models& m = models();
  const fs::path out = out_dir();
  forja("export --model " + m.qwen.string() + " --out " + (out / "m.gguf").string());
  const test::GgufFile f = test::read_gguf(out / "m.gguf");
  const ModelConfig c = load_model_config(m.qwen);
  EXPECT_EQ(f.kv.at("general.architecture").s(), "qwen3");
  EXPECT_EQ(f.kv.at("general.type").s(), "model");
  EXPECT_EQ(f.kv.at("general.file_type").u(), 1u);  // MOSTLY_F16, the default for a model
  EXPECT_EQ(f.kv.at("qwen3.block_count").u(), 2u);
  EXPECT_EQ(f.kv.at("qwen3.embedding_length").u(), 64u);
  EXPECT_EQ(f.kv.at("qwen3.feed_forward_length").u(), 128u);
  EXPECT_EQ(f.kv.at("qwen3.attention.head_count").u(), std::uint64_t(c.num_heads));
  EXPECT_EQ(f.kv.at("qwen3.attention.head_count_kv").u(), std::uint64_t(c.num_kv_heads));
  EXPECT_EQ(f.kv.at("qwen3.attention.key_length").u(), 16u);
  EXPECT_EQ(f.kv.at("qwen3.attention.layer_norm_rms_epsilon").type, 6u);
  EXPECT_NEAR(f.kv.at("qwen3.rope.freq_base").f(), c.rope_theta, 1e-3);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.model").s(), "gpt2");
  EXPECT_EQ(f.kv.at("tokenizer.ggml.pre").s(), "qwen2");
  const json tok = json::parse(io::read_text_file(m.qwen / "tokenizer.json"));
  const auto& tokens = f.kv.at("tokenizer.ggml.tokens").strings;
  ASSERT_EQ(tokens.size(), std::size_t(c.vocab_size));
  for (auto it = tok["model"]["vocab"].begin(); it != tok["model"]["vocab"].end(); ++it)
    ASSERT_EQ(tokens[it->get<std::size_t>()], it.key());
  EXPECT_EQ(f.kv.at("tokenizer.ggml.merges").strings.size(), tok["model"]["merges"].size());
  const auto& types = f.kv.at("tokenizer.ggml.token_type").ints;
  for (const json& a : tok["added_tokens"]) EXPECT_EQ(types[a["id"].get<std::size_t>()], 3) << a.dump();
  EXPECT_EQ(f.kv.at("tokenizer.ggml.eos_token_id").u(), std::uint64_t(c.eos_token_ids.at(0)));
  EXPECT_TRUE(f.kv.count("tokenizer.chat_template"));
  EXPECT_FALSE(f.kv.at("tokenizer.ggml.add_bos_token").b());
  // Tensors: names, ne, types (the values are checked in f32 on the Llama below).
  EXPECT_EQ(f.tensor("token_embd.weight")->ne, (std::vector<std::uint64_t>{64, std::uint64_t(c.vocab_size)}));
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight")->type, 0u);  // 1-D stays f32
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight")->type, 1u);
  EXPECT_TRUE(f.tensor("blk.1.attn_q_norm.weight") && f.tensor("blk.1.attn_k_norm.weight"));
  EXPECT_TRUE(f.tensor("output_norm.weight"));
  EXPECT_EQ(f.tensor("output.weight") != nullptr, !c.tie_word_embeddings);

  // A Llama: q/k rows permuted, llama3 rope factors, vocab_size and rope.dimension_count keys.
  forja("export --model " + m.llama.string() + " --out " + (out / "l.gguf").string() + " --dtype f32");
  const test::GgufFile l = test::read_gguf(out / "l.gguf");
  EXPECT_EQ(l.kv.at("general.file_type").u(), 0u);
  EXPECT_EQ(l.kv.at("tokenizer.ggml.pre").s(), "llama-bpe");
  EXPECT_EQ(l.kv.at("llama.rope.dimension_count").u(), 16u);
  EXPECT_EQ(l.kv.at("llama.vocab_size").u(), std::uint64_t(c.vocab_size));
  EXPECT_FALSE(l.tensor("blk.0.attn_q_norm.weight"));
  const auto ck = io::SafetensorsCheckpoint::open(m.llama);
  const std::vector<float> wq = ck.tensor("model.layers.0.self_attn.q_proj.weight").to_float();
  const std::vector<float> wk = ck.tensor("model.layers.0.self_attn.k_proj.weight").to_float();
  EXPECT_EQ(l.floats("blk.0.attn_q.weight"), permuted(wq, c.num_heads * c.head_dim, c.num_heads));
  EXPECT_EQ(l.floats("blk.0.attn_k.weight"), permuted(wk, c.num_kv_heads * c.head_dim, c.num_kv_heads));
  EXPECT_EQ(l.floats("blk.0.ffn_down.weight"), ck.tensor("model.layers.0.mlp.down_proj.weight").to_float());
  const std::vector<float> factors = l.floats("rope_freqs.weight");
  ASSERT_EQ(factors.size(), 8u);
  EXPECT_EQ(factors.front(), 1.0f);  // the highest frequency is kept
  EXPECT_EQ(factors.back(), 8.0f);   // the lowest is divided by the factor
}

TEST(GgufExport, RefusesWhatItCannotWriteWithTheFix) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const Models& m = models();
  const fs::path out = out_dir();
  forja("export --adapter " + m.qwen_adapter.string() + " --out " + (out / "a.gguf").string());
  auto [rc, text] = run(program() + " export --adapter " + m.qwen_adapter.string() + " --out " + (out / "a.gguf").string());
  EXPECT_EQ(rc, 2);
  EXPECT_NE(text.find("--overwrite"), std::string::npos) << text;
  // An adapter whose base_model_name_or_path is a hub id: --base is needed.
  fs::copy(m.qwen_adapter, out / "hub-adapter");
  json cfg = json::parse(io::read_text_file(out / "hub-adapter" / "adapter_config.json"));
  cfg["base_model_name_or_path"] = "Qwen/Qwen3-0.6B";
  std::ofstream(out / "hub-adapter" / "adapter_config.json") << cfg.dump(2);
  std::tie(rc, text) = run(program() + " export --adapter " + (out / "hub-adapter").string() + " --out " +
                           (out / "b.gguf").string());
  EXPECT_EQ(rc, 2);
  EXPECT_NE(text.find("--base"), std::string::npos) << text;
  forja("export --adapter " + (out / "hub-adapter").string() + " --base " + m.qwen.string() + " --out " +
        (out / "b.gguf").string());
  // A --base that is no model directory.
  std::tie(rc, text) = run(program() + " export --adapter " + m.qwen_adapter.string() + " --base " +
                           (m.dir / "none").string() + " --out " + (out / "c.gguf").string());
  EXPECT_EQ(rc, 2) << text;
  // A model without tokenizer.json.
  fs::copy(m.qwen, out / "no-tok");
  fs::remove(out / "no-tok" / "tokenizer.json");
  std::tie(rc, text) = run(program() + " export --model " + (out / "no-tok").string() + " --out " + (out / "d.gguf").string());
  EXPECT_EQ(rc, 2);
  EXPECT_NE(text.find("tokenizer.json"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(out / "d.gguf"));
}

// ---- against a real llama.cpp ----

fs::path llama_cpp_script() { return fs::path(FORJA_SOURCE_DIR) / "tests/interop/llama_cpp_logits.mjs"; }

bool llama_cpp_available() {
  return fs::exists(fs::path(FORJA_SOURCE_DIR) / "third_party/npm-llama-cpp/node_modules/node-llama-cpp/package.json") &&
         run("node --version").first == 0;
}

struct LlamaCppResult {
  std::vector<std::vector<float>> logits;  // [positions][vocab]
  std::vector<std::int64_t> tokens;
};

LlamaCppResult llama_cpp(const fs::path& model, const std::string& adapter, const std::vector<int>& ids,
                         const std::string& text = "") {
  const fs::path dir = out_dir();
  std::ofstream(dir / "ids.json") << json(ids).dump();
  const auto [rc, out] = run("node " + llama_cpp_script().string() + " " + model.string() + " " + adapter + " " +
                             (dir / "ids.json").string() + " " + (dir / "llama.json").string() +
                             (text.empty() ? "" : " '" + text + "'"));
  EXPECT_EQ(rc, 0) << out;
  LlamaCppResult r;
  if (rc != 0) return r;
  const json j = json::parse(io::read_text_file(dir / "llama.json"));
  for (const json& row : j["logits"]) r.logits.push_back(row.get<std::vector<float>>());
  if (j.contains("tokens")) r.tokens = j["tokens"].get<std::vector<std::int64_t>>();
  return r;
}

// forja's logits of `ids` (dense fp32 base, adapter applied), [positions][vocab].
std::vector<std::vector<float>> forja_logits(const fs::path& model, const fs::path& adapter, const std::vector<int>& ids) {
  const fs::path dir = out_dir();
  std::ofstream(dir / "ids.jsonl") << json{{"input_ids", ids}}.dump() << "\n";
  forja("eval --model " + model.string() + " --adapter " + adapter.string() + " --quant none --data " +
        (dir / "ids.jsonl").string() + " --seq-len 32 --batch-size 1 --dump-logits " + (dir / "forja.safetensors").string());
  const auto f = io::SafetensorsFile::open(dir / "forja.safetensors");
  const std::vector<float> flat = f.tensor("logits").to_float();
  const std::size_t v = static_cast<std::size_t>(f.tensor("logits").shape()[1]);
  std::vector<std::vector<float>> out;
  for (std::size_t p = 0; p < ids.size(); ++p) out.emplace_back(flat.begin() + p * v, flat.begin() + (p + 1) * v);
  return out;
}

double max_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double worst = 0.0;
  for (std::size_t p = 0; p < a.size(); ++p) {
    if (a[p].size() != b[p].size()) return INFINITY;
    for (std::size_t i = 0; i < a[p].size(); ++i) worst = std::max(worst, std::fabs(double(a[p][i]) - b[p][i]));
  }
  return worst;
}

const std::vector<int> kIds = {1, 5, 9, 30, 44, 2, 300, 17, 260, 100, 7};

TEST(GgufLlamaCpp, Qwen3BaseAndAdapterGiveForjasLogits) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  if (!llama_cpp_available()) GTEST_SKIP() << "node-llama-cpp is not installed: run scripts/setup";
  const Models& m = models();
  const fs::path out = out_dir();
  forja("export --model " + m.qwen.string() + " --dtype f32 --out " + (out / "base.gguf").string());
  forja("export --adapter " + m.qwen_adapter.string() + " --out " + (out / "lora.gguf").string());
  forja("export --model " + m.qwen.string() + " --adapter " + m.qwen_adapter.string() + " --dtype f16 --out " +
        (out / "merged-f16.gguf").string());
  const auto want = forja_logits(m.qwen, m.qwen_adapter, kIds);
  const std::string sentence = "The capital of France is Paris.";
  const LlamaCppResult lora = llama_cpp(out / "base.gguf", (out / "lora.gguf").string(), kIds, sentence);
  const double f32 = max_difference(lora.logits, want);
  const double f16 = max_difference(llama_cpp(out / "merged-f16.gguf", "-", kIds).logits, want);
  std::printf("qwen3: llama.cpp vs forja logits, max |difference|: f32 base + adapter %.3g, f16 merged %.3g\n", f32, f16);
  EXPECT_LT(f32, 1e-4);
  EXPECT_LT(f16, 2e-2);
  // Without the adapter the logits differ: the comparison above sees the adapter.
  EXPECT_GT(max_difference(llama_cpp(out / "base.gguf", "-", kIds).logits, want), 1e-2);
  // The tokenizer metadata: llama.cpp tokenises like forja.
  const auto [rc, ids] = run(program() + " tokenize --model " + m.qwen.string() + " --text '" + sentence + "'");
  ASSERT_EQ(rc, 0) << ids;
  EXPECT_EQ(json(lora.tokens), json::parse(ids.substr(ids.find('['))));
}

TEST(GgufLlamaCpp, Qwen2WithBiasesGivesForjasLogits) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  if (!llama_cpp_available()) GTEST_SKIP() << "node-llama-cpp is not installed: run scripts/setup";
  const Models& m = models();
  const fs::path out = out_dir();
  forja("export --model " + m.qwen2.string() + " --dtype f32 --out " + (out / "base.gguf").string());
  forja("export --adapter " + m.qwen2_adapter.string() + " --out " + (out / "lora.gguf").string());
  const test::GgufFile f = test::read_gguf(out / "base.gguf");
  EXPECT_EQ(f.kv.at("general.architecture").s(), "qwen2");
  ASSERT_TRUE(f.tensor("blk.1.attn_v.bias"));
  EXPECT_EQ(f.tensor("blk.1.attn_v.bias")->type, 0u);
  EXPECT_FALSE(f.tensor("blk.1.attn_q_norm.weight"));
  const auto want = forja_logits(m.qwen2, m.qwen2_adapter, kIds);
  const double f32 = max_difference(llama_cpp(out / "base.gguf", (out / "lora.gguf").string(), kIds).logits, want);
  std::printf("qwen2: llama.cpp vs forja logits, max |difference|: f32 base (q/k/v biases) + adapter %.3g\n", f32);
  EXPECT_LT(f32, 1e-4);
}

TEST(GgufLlamaCpp, LlamaWithLlama3RopeAndRsLoraGivesForjasLogits) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  if (!llama_cpp_available()) GTEST_SKIP() << "node-llama-cpp is not installed: run scripts/setup";
  const Models& m = models();
  const fs::path out = out_dir();
  forja("export --model " + m.llama.string() + " --dtype f32 --out " + (out / "base.gguf").string());
  forja("export --adapter " + m.llama_adapter.string() + " --dtype f32 --out " + (out / "lora.gguf").string());
  const auto want = forja_logits(m.llama, m.llama_adapter, kIds);
  const double f32 = max_difference(llama_cpp(out / "base.gguf", (out / "lora.gguf").string(), kIds).logits, want);
  std::printf("llama: llama.cpp vs forja logits, max |difference|: f32 base + rsLoRA adapter %.3g\n", f32);
  EXPECT_LT(f32, 1e-4);
}

}  // namespace
}  // namespace forja::model
