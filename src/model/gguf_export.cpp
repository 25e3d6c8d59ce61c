// GGUF export of adapters and models (see model/gguf_export.h for what is written and why).
#include "model/gguf_export.h"

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <optional>
#include <thread>

#include "io/adapter.h"
#include "io/float16.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/bnb4.h"
#include "model/config.h"
#include "model/merge.h"
#include "quant/nf4.h"
#include "util/error.h"

namespace forja::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// gguf-py LlamaFileType and GGML_QUANT_VERSION.
std::uint32_t file_type(io::GgmlType t) {
  switch (t) {
    case io::GgmlType::f32:
      return 0;  // ALL_F32
    case io::GgmlType::f16:
      return 1;  // MOSTLY_F16
    case io::GgmlType::bf16:
      return 32;  // MOSTLY_BF16
  }
  return 0;
}
constexpr std::uint32_t kQuantVersion = 2;

// Token types (gguf-py TokenType / llama.cpp llama_token_type).
constexpr std::int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// llama.cpp's architecture names (gguf-py MODEL_ARCH_NAMES); Mistral converts as "llama".
const char* gguf_architecture(Architecture a) {
  switch (a) {
    case Architecture::Qwen3:
      return "qwen3";
    case Architecture::Qwen2:
      return "qwen2";
    case Architecture::Llama:
    case Architecture::Mistral:
      return "llama";
  }
  return "?";
}

bool interleaved_rope(Architecture a) { return a == Architecture::Llama || a == Architecture::Mistral; }

// gguf-py MODEL_TENSOR names of the seven projections.
const char* gguf_linear(LinearKind k) {
  switch (k) {
    case LinearKind::Q:
      return "attn_q";
    case LinearKind::K:
      return "attn_k";
    case LinearKind::V:
      return "attn_v";
    case LinearKind::O:
      return "attn_output";
    case LinearKind::Gate:
      return "ffn_gate";
    case LinearKind::Up:
      return "ffn_up";
    case LinearKind::Down:
      return "ffn_down";
  }
  return "?";
}

std::string blk(std::int64_t layer, const std::string& what) {
  return "blk." + std::to_string(layer) + "." + what;
}

LinearKind kind_of(const std::string& target_name) {
  for (LinearKind k : kAllLinears)
    if (target_name == linear_name(k)) return k;
  throw std::logic_error("gguf export: unknown projection " + target_name);
}

io::Dtype io_dtype(io::GgmlType t) {
  switch (t) {
    case io::GgmlType::f32:
      return io::Dtype::F32;
    case io::GgmlType::f16:
      return io::Dtype::F16;
    case io::GgmlType::bf16:
      return io::Dtype::BF16;
  }
  return io::Dtype::F32;
}

// fp32 values -> the tensor's type, rounded to nearest even (gguf-py's numpy/bf16 conversion).
void store_floats(io::GgmlType t, std::span<const float> v, std::byte* out) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == io::GgmlType::f32) {
      std::memcpy(out + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t h = t == io::GgmlType::f16 ? io::float_to_f16(v[i]) : io::float_to_bf16(v[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
}

// How many heads a projection's output rows are permuted over for llama.cpp's interleaved rope
// (convert_hf_to_gguf.py LlamaModel.permute: q by num_heads, k by num_kv_heads), 0 for none.
std::int64_t permute_heads(const ModelConfig& c, LinearKind k) {
  if (!interleaved_rope(c.architecture)) return 0;
  if (k == LinearKind::Q) return c.num_heads;
  if (k == LinearKind::K) return c.num_kv_heads;
  return 0;
}

// Rows of a row-major [rows, row_bytes] buffer reordered in place: destination row (h, j, i) of
// [heads, d/2, 2] takes source row (h, i, j) of [heads, 2, d/2].
void permute_rows(std::span<std::byte> data, std::int64_t rows, std::int64_t heads) {
  if (heads == 0) return;
  const std::size_t row_bytes = data.size() / static_cast<std::size_t>(rows);
  const std::int64_t d = rows / heads, half = d / 2;
  std::vector<std::byte> src(data.begin(), data.end());
  for (std::int64_t dst = 0; dst < rows; ++dst) {
    const std::int64_t h = dst / d, r = dst % d, j = r / 2, i = r % 2;
    const std::int64_t from = h * d + i * half + j;
    std::memcpy(data.data() + dst * row_bytes, src.data() + from * row_bytes, row_bytes);
  }
}

void check_out(const GgufExportOptions& o) {
  std::error_code ec;
  if (o.out.empty()) throw UserError("--out: give the .gguf file to write");
  if (fs::is_directory(o.out, ec))
    throw UserError("--out " + o.out.string() + " is a directory; give the path of the .gguf file to write");
  if (fs::exists(o.out, ec) && !o.overwrite)
    throw UserError("--out " + o.out.string() + " exists; choose another path or add --overwrite");
}

std::uint64_t bytes_on_disk(const fs::path& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : static_cast<std::uint64_t>(n);
}

// ---- the tokenizer as llama.cpp's "gpt2" (byte-level BPE) vocabulary ----

struct GgufVocab {
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  std::vector<std::string> merges;
  std::optional<std::int64_t> bos, eos, pad;
  bool add_bos = false;
  std::optional<std::string> chat_template;
};

json read_json(const fs::path& p) {
  try {
    return json::parse(io::read_text_file(p));
  } catch (const json::exception& e) {
    throw UserError(p.string() + ": invalid JSON (" + e.what() + "); re-download it");
  }
}

bool has_byte_level(const json& pre) {
  if (!pre.is_object()) return false;
  if (pre.value("type", "") == "ByteLevel") return true;
  if (pre.contains("pretokenizers") && pre["pretokenizers"].is_array())
    for (const json& p : pre["pretokenizers"])
      if (has_byte_level(p)) return true;
  return false;
}

// Whether the post-processor prepends a special token to a single sequence (Llama 3's BOS).
bool post_processor_adds_bos(const json& post) {
  if (!post.is_object()) return false;
  if (post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
      post["single"].is_array() && !post["single"].empty())
    return post["single"][0].contains("SpecialToken");
  if (post.contains("processors") && post["processors"].is_array())
    for (const json& p : post["processors"])
      if (post_processor_adds_bos(p)) return true;
  return false;
}

GgufVocab read_vocab(const fs::path& dir, const ModelConfig& c) {
  const fs::path file = dir / "tokenizer.json";
  std::error_code ec;
  if (!fs::exists(file, ec))
    throw UserError(file.string() + ": not found; a GGUF model carries its tokenizer: give a model "
                    "directory with tokenizer.json");
  const json t = read_json(file);
  const json& model = t.contains("model") ? t["model"] : json();
  if (!model.is_object() || model.value("type", "") != "BPE" || !model.contains("vocab") ||
      !model["vocab"].is_object() || !t.contains("pre_tokenizer") || !has_byte_level(t["pre_tokenizer"]))
    throw UserError(file.string() + ": not a byte-level BPE tokenizer (Qwen, Llama 3); forja's GGUF "
                    "export writes llama.cpp's \"gpt2\" vocabulary only: convert this model with "
                    "llama.cpp's convert_hf_to_gguf.py");
  GgufVocab v;
  const std::int64_t n = c.vocab_size;
  v.tokens.assign(static_cast<std::size_t>(n), "");
  v.types.assign(static_cast<std::size_t>(n), kUnused);
  std::vector<bool> set(static_cast<std::size_t>(n), false);
  auto place = [&](std::int64_t id, const std::string& text, std::int32_t type) {
    if (id < 0 || id >= n)
      throw UserError(file.string() + ": token '" + text + "' has id " + std::to_string(id) +
                      ", outside config.json's vocab_size " + std::to_string(n) +
                      "; the tokenizer and the model do not belong together");
    v.tokens[static_cast<std::size_t>(id)] = text;
    v.types[static_cast<std::size_t>(id)] = type;
    set[static_cast<std::size_t>(id)] = true;
  };
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it->is_number_integer()) throw UserError(file.string() + ": vocab entry '" + it.key() + "' has no integer id");
    place(it->get<std::int64_t>(), it.key(), kNormal);
  }
  std::map<std::string, std::int64_t> added;
  if (t.contains("added_tokens") && t["added_tokens"].is_array())
    for (const json& a : t["added_tokens"]) {
      if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string())
        throw UserError(file.string() + ": an added_tokens entry lacks an integer id or a content string");
      const std::string content = a["content"].get<std::string>();
      place(a["id"].get<std::int64_t>(), content, a.value("special", false) ? kControl : kUserDefined);
      added[content] = a["id"].get<std::int64_t>();
    }
  // Ids no token uses (the embedding's padding rows) as convert_hf_to_gguf.py names them.
  for (std::int64_t id = 0; id < n; ++id)
    if (!set[static_cast<std::size_t>(id)]) v.tokens[static_cast<std::size_t>(id)] = "[PAD" + std::to_string(id) + "]";
  if (model.contains("merges") && model["merges"].is_array())
    for (const json& m : model["merges"]) {
      if (m.is_string()) {
        v.merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      } else {
        throw UserError(file.string() + ": a merges entry is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }

  // Special ids: tokenizer_config.json's tokens first, then config.json's ids (gguf-py SpecialVocab).
  json tc;
  if (fs::exists(dir / "tokenizer_config.json", ec)) tc = read_json(dir / "tokenizer_config.json");
  auto token_id = [&](const char* key) -> std::optional<std::int64_t> {
    if (!tc.is_object() || !tc.contains(key)) return std::nullopt;
    const json& e = tc[key];
    const std::string text = e.is_string() ? e.get<std::string>()
                             : e.is_object() && e.contains("content") && e["content"].is_string()
                                 ? e["content"].get<std::string>()
                                 : std::string();
    if (text.empty()) return std::nullopt;
    if (auto a = added.find(text); a != added.end()) return a->second;
    if (model["vocab"].contains(text)) return model["vocab"][text].get<std::int64_t>();
    return std::nullopt;
  };
  v.bos = token_id("bos_token");
  if (!v.bos && !c.bos_token_ids.empty()) v.bos = c.bos_token_ids.front();
  v.eos = token_id("eos_token");
  if (!v.eos && !c.eos_token_ids.empty()) v.eos = c.eos_token_ids.front();
  v.pad = token_id("pad_token");
  if (tc.is_object() && tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean())
    v.add_bos = tc["add_bos_token"].get<bool>();
  else if (t.contains("post_processor"))
    v.add_bos = post_processor_adds_bos(t["post_processor"]);
  if (tc.is_object() && tc.contains("chat_template") && tc["chat_template"].is_string())
    v.chat_template = tc["chat_template"].get<std::string>();
  else if (fs::exists(dir / "chat_template.jinja", ec))
    v.chat_template = io::read_text_file(dir / "chat_template.jinja");
  return v;
}

// llama3 rope factors (convert_hf_to_gguf.py LlamaModel.generate_extra_tensors).
std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
  std::vector<float> out;
  for (std::int64_t i = 0; i < c.head_dim; i += 2) {
    // torch: 1 / base ** (arange(0, dim, 2) / dim), in fp32
    const float exponent = static_cast<float>(i) / static_cast<float>(c.head_dim);
    const float freq = 1.0f / std::pow(static_cast<float>(c.rope_theta), exponent);
    const double wavelen = 2.0 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(static_cast<float>(s.factor));
    } else {
      const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      out.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / s.factor + smooth)));
    }
  }
  return out;
}

// Runs fn(begin, end) over [0, n) on up to `threads` threads.
void parallel_rows(std::int64_t n, int threads, const std::function<void(std::int64_t, std::int64_t)>& fn) {
  const std::int64_t parts = std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n));
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(parts));
  for (std::int64_t p = 0; p < parts; ++p)
    pool.emplace_back([&, p] {
      try {
        fn(n * p / parts, n * (p + 1) / parts);
      } catch (...) {
        errors[static_cast<std::size_t>(p)] = std::current_exception();
      }
    });
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

GgufExportSummary export_adapter_gguf(const GgufExportOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.adapter_dir, ec))
    throw UserError("--adapter " + o.adapter_dir.string() +
                    ": not a directory; give a PEFT adapter directory (adapter_config.json + "
                    "adapter_model.safetensors)");
  // The base's config.json names the architecture and the head counts; its weights are not read.
  fs::path base = o.base_dir;
  if (base.empty()) {
    const fs::path cfg = o.adapter_dir / "adapter_config.json";
    if (!fs::exists(cfg, ec)) throw UserError(cfg.string() + ": not found; give a PEFT adapter directory");
    const io::LoraConfig lc = io::parse_adapter_config(io::read_text_file(cfg), cfg.string());
    if (lc.base_model_name_or_path.empty() || !fs::exists(fs::path(lc.base_model_name_or_path) / "config.json", ec))
      throw UserError(cfg.string() + ": base_model_name_or_path \"" + lc.base_model_name_or_path +
                      "\" is not a local model directory; give --base DIR, the base model's directory "
                      "(only its config.json is read)");
    base = lc.base_model_name_or_path;
  }
  const ModelConfig c = load_model_config(base);
  const io::LoraTargetShapes shapes = lora_target_shapes(c);
  const io::AdapterFile adapter = io::AdapterFile::open(o.adapter_dir, shapes);
  check_out(o);

  GgufExportSummary summary;
  summary.architecture = gguf_architecture(c.architecture);
  const std::int64_t r = adapter.config().r;
  // llama.cpp applies alpha / r: write the alpha that gives the adapter's own scale.
  summary.lora_alpha = adapter.config().scaling() * static_cast<double>(r);
  io::GgufWriter w;
  w.add_string("general.architecture", summary.architecture);
  w.add_string("general.type", "adapter");
  w.add_string("general.name", o.adapter_dir.filename().empty() ? o.adapter_dir.parent_path().filename().string()
                                                                 : o.adapter_dir.filename().string());
  w.add_string("adapter.type", "lora");
  w.add_f32("adapter.lora.alpha", static_cast<float>(summary.lora_alpha));
  w.add_u32("general.quantization_version", kQuantVersion);
  for (std::int64_t layer = 0; layer < adapter.num_layers(); ++layer)
    for (const io::LoraTarget& t : adapter.targets()) {
      const LinearKind k = kind_of(t.name);
      const std::string name = blk(layer, gguf_linear(k)) + ".weight";
      const io::TensorView a = adapter.factor(layer, t, 'A');
      const io::TensorView b = adapter.factor(layer, t, 'B');
      w.add_tensor(name + ".lora_a", o.dtype, {r, t.in_features}, [a, dtype = o.dtype](std::span<std::byte> out) {
        store_floats(dtype, a.to_float(), out.data());
      });
      const std::int64_t heads = permute_heads(c, k);
      w.add_tensor(name + ".lora_b", o.dtype, {t.out_features, r},
                   [b, heads, rows = t.out_features, dtype = o.dtype](std::span<std::byte> out) {
                     store_floats(dtype, b.to_float(), out.data());
                     permute_rows(out, rows, heads);
                   });
    }
  w.write(o.out);
  summary.tensors = w.tensor_count();
  summary.file_bytes = bytes_on_disk(o.out);
  return summary;
}

GgufExportSummary export_model_gguf(const GgufExportOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.model_dir, ec))
    throw UserError("--model " + o.model_dir.string() + ": not a directory; give a Hugging Face model directory");
  const ModelConfig c = load_model_config(o.model_dir);
  if (c.architecture == Architecture::Mistral)
    throw UserError(o.model_dir.string() + ": Mistral's tokenizer is SentencePiece-style, which forja's GGUF "
                    "export does not write; export the adapter with --adapter (llama.cpp loads it on a "
                    "GGUF of the base from convert_hf_to_gguf.py), or merge and convert with llama.cpp");
  if (c.sliding_window)
    throw UserError(o.model_dir.string() + ": sliding-window attention is not written to GGUF by forja; "
                    "convert this model with llama.cpp's convert_hf_to_gguf.py");
  const GgufVocab vocab = read_vocab(o.model_dir, c);
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(o.model_dir);
  std::optional<io::AdapterFile> adapter;
  const io::LoraTargetShapes shapes = lora_target_shapes(c);
  if (!o.adapter_dir.empty()) adapter.emplace(io::AdapterFile::open(o.adapter_dir, shapes));
  check_out(o);
  const int threads = o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  GgufExportSummary summary;
  summary.architecture = gguf_architecture(c.architecture);
  const std::string arch = summary.architecture;
  io::GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_string("general.type", "model");
  w.add_string("general.name", o.model_dir.filename().empty() ? o.model_dir.parent_path().filename().string()
                                                               : o.model_dir.filename().string());
  w.add_u32(arch + ".block_count", static_cast<std::uint32_t>(c.num_layers));
  w.add_u32(arch + ".context_length", static_cast<std::uint32_t>(c.max_position_embeddings));
  w.add_u32(arch + ".embedding_length", static_cast<std::uint32_t>(c.hidden_size));
  w.add_u32(arch + ".feed_forward_length", static_cast<std::uint32_t>(c.intermediate_size));
  w.add_u32(arch + ".attention.head_count", static_cast<std::uint32_t>(c.num_heads));
  w.add_u32(arch + ".attention.head_count_kv", static_cast<std::uint32_t>(c.num_kv_heads));
  w.add_f32(arch + ".rope.freq_base", static_cast<float>(c.rope_theta));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.add_u32(arch + ".attention.key_length", static_cast<std::uint32_t>(c.head_dim));
  w.add_u32(arch + ".attention.value_length", static_cast<std::uint32_t>(c.head_dim));
  w.add_u32("general.file_type", file_type(o.dtype));
  if (interleaved_rope(c.architecture)) {
    w.add_u32(arch + ".vocab_size", static_cast<std::uint32_t>(c.vocab_size));
    w.add_u32(arch + ".rope.dimension_count", static_cast<std::uint32_t>(c.head_dim));
  }
  if (c.rope_scaling.type == RopeType::Linear) {
    w.add_string(arch + ".rope.scaling.type", "linear");
    w.add_f32(arch + ".rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
  }
  w.add_u32("general.quantization_version", kQuantVersion);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", interleaved_rope(c.architecture) ? "llama-bpe" : "qwen2");
  w.add_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.add_i32_array("tokenizer.ggml.token_type", vocab.types);
  w.add_string_array("tokenizer.ggml.merges", vocab.merges);
  if (vocab.bos) w.add_u32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(*vocab.bos));
  if (vocab.eos) w.add_u32("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(*vocab.eos));
  if (vocab.pad) w.add_u32("tokenizer.ggml.padding_token_id", static_cast<std::uint32_t>(*vocab.pad));
  w.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  if (vocab.chat_template) w.add_string("tokenizer.chat_template", *vocab.chat_template);

  // A dense tensor copied (converted to f32 when 1-D, else to the chosen dtype).
  auto dense = [&](const std::string& hf, const std::string& gguf, std::vector<std::int64_t> shape) {
    const io::TensorInfo* info = ck.find(hf);
    if (!info)
      throw UserError(ck.path_of(hf).string() + ": has no tensor '" + hf + "' that config.json implies; the "
                      "checkpoint is incomplete or does not match config.json");
    if (info->shape != shape)
      throw UserError(ck.path_of(hf).string() + ": tensor '" + hf + "' does not have the shape config.json "
                      "implies; the weights and config.json belong to different models");
    const io::GgmlType type = shape.size() == 1 ? io::GgmlType::f32 : o.dtype;
    const io::TensorView view = ck.tensor(hf);
    w.add_tensor(gguf, type, std::move(shape), [view, type, &ck, hf](std::span<std::byte> out) {
      const std::int64_t n = view.numel();
      const std::int64_t chunk = 1 << 16;
      std::vector<float> values(static_cast<std::size_t>(std::min(n, chunk)));
      for (std::int64_t first = 0; first < n; first += chunk) {
        const std::size_t m = static_cast<std::size_t>(std::min(chunk, n - first));
        view.to_float(std::span<float>(values.data(), m), first);
        store_floats(type, std::span<const float>(values.data(), m),
                     out.data() + static_cast<std::size_t>(first) * io::ggml_type_size(type));
      }
      ck.release(hf);
    });
  };

  const std::int64_t H = c.hidden_size, d = c.head_dim;
  dense("model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, H});
  for (std::int64_t layer = 0; layer < c.num_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    dense(p + "input_layernorm.weight", blk(layer, "attn_norm.weight"), {H});
    for (LinearKind k : kAllLinears) {
      const LinearShape s = linear_shape(c, k);
      const std::string hf = linear_path(layer, k) + ".weight";
      const std::string gguf = blk(layer, gguf_linear(k)) + ".weight";
      const std::int64_t heads = permute_heads(c, k);
      const io::LoraTarget* target = nullptr;
      if (adapter)
        for (const io::LoraTarget& t : adapter->targets())
          if (t.name == linear_name(k)) target = &t;
      const bool bnb = is_bnb4_weight(ck, hf);
      if (!bnb && !ck.find(hf))
        throw UserError(ck.path_of(hf).string() + ": has no tensor '" + hf + "'; the checkpoint is incomplete");
      if (!bnb && ck.find(hf)->shape != std::vector<std::int64_t>{s.out_features, s.in_features})
        throw UserError(ck.path_of(hf).string() + ": tensor '" + hf + "' does not have the shape config.json "
                        "implies; the weights and config.json belong to different models");
      w.add_tensor(gguf, o.dtype, {s.out_features, s.in_features},
                   [&, hf, s, heads, target, bnb, layer](std::span<std::byte> out) {
                     // W: as stored, or a bitsandbytes NF4 weight dequantised (the weights QLoRA saw).
                     std::optional<quant::Nf4Tensor> nf4;
                     std::optional<io::TensorView> view;
                     if (bnb) nf4.emplace(read_bnb4_weight(ck, hf, {s.out_features, s.in_features}));
                     else view.emplace(ck.tensor(hf));
                     WeightReader reader = [&](std::int64_t first, std::span<float> v) {
                       if (nf4) quant::nf4_dequantize(*nf4, first, v);
                       else view->to_float(v, first);
                     };
                     const io::Dtype dtype = io_dtype(o.dtype);
                     if (target) {
                       // W + scale B A, in double and rounded once, as forja merge does.
                       const std::int64_t rank = adapter->config().r, in = s.in_features;
                       const std::int64_t stride = merge_a_stride(in);
                       std::vector<double> a(static_cast<std::size_t>(rank * stride), 0.0);
                       const std::vector<float> af = adapter->factor(layer, *target, 'A').to_float();
                       for (std::int64_t kk = 0; kk < rank; ++kk)
                         for (std::int64_t col = 0; col < in; ++col)
                           a[static_cast<std::size_t>(kk * stride + col)] = af[static_cast<std::size_t>(kk * in + col)];
                       const std::vector<float> b = adapter->factor(layer, *target, 'B').to_float();
                       const double scale = adapter->config().scaling();
                       parallel_rows(s.out_features, threads, [&](std::int64_t r0, std::int64_t r1) {
                         merge_rows(reader, in, rank, a.data(), stride, b.data(), scale, dtype, r0, r1, out);
                       });
                     } else {
                       std::vector<float> row(static_cast<std::size_t>(s.in_features));
                       for (std::int64_t r = 0; r < s.out_features; ++r) {
                         reader(r * s.in_features, row);
                         store_floats(o.dtype, row, out.data() + static_cast<std::size_t>(r * s.in_features) *
                                                                      io::ggml_type_size(o.dtype));
                       }
                     }
                     permute_rows(out, s.out_features, heads);
                     ck.release(hf);
                   });
      if (s.bias) {
        // Biases of q/k follow their rows' permutation.
        const std::string hb = linear_path(layer, k) + ".bias";
        const io::TensorInfo* info = ck.find(hb);
        if (!info || info->shape != std::vector<std::int64_t>{s.out_features})
          throw UserError(ck.path_of(hb).string() + ": tensor '" + hb + "' is missing or has the wrong shape; "
                          "the checkpoint does not match config.json");
        const io::TensorView view = ck.tensor(hb);
        w.add_tensor(blk(layer, gguf_linear(k)) + ".bias", io::GgmlType::f32, {s.out_features},
                     [view, heads, rows = s.out_features](std::span<std::byte> out) {
                       store_floats(io::GgmlType::f32, view.to_float(), out.data());
                       permute_rows(out, rows, heads);
                     });
      }
      if (k == LinearKind::K && c.qk_norm) {
        dense(p + "self_attn.q_norm.weight", blk(layer, "attn_q_norm.weight"), {d});
        dense(p + "self_attn.k_norm.weight", blk(layer, "attn_k_norm.weight"), {d});
      }
      if (k == LinearKind::O) dense(p + "post_attention_layernorm.weight", blk(layer, "ffn_norm.weight"), {H});
    }
  }
  dense("model.norm.weight", "output_norm.weight", {H});
  if (!c.tie_word_embeddings) dense("lm_head.weight", "output.weight", {c.vocab_size, H});
  if (c.rope_scaling.type == RopeType::Llama3) {
    const std::vector<float> factors = llama3_rope_factors(c);
    w.add_tensor("rope_freqs.weight", io::GgmlType::f32, {static_cast<std::int64_t>(factors.size())},
                 [factors](std::span<std::byte> out) { std::memcpy(out.data(), factors.data(), out.size()); });
  }
  w.write(o.out);
  summary.tensors = w.tensor_count();
  summary.file_bytes = bytes_on_disk(o.out);
  return summary;
}

}  // namespace forja::model
