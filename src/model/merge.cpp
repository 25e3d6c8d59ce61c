// LoRA merge into a Hugging Face checkpoint, streamed tensor by tensor (see model/merge.h).
#include "model/merge.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/adapter.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/float16.h"
#include "io/json_file.h"
#include "model/config.h"
#include "model/bnb4.h"
#include "model/nf4.h"
#include "util/error.h"

namespace forja::model {
namespace {

namespace fs = std::filesystem;

// Columns per tile of the B A product: a tile of A (r rows of 256 doubles, 32 KB at r = 16)
// stays in cache while every output row of the thread passes over it.
constexpr std::int64_t kTile = 256;

// v rounded to float towards zero, with the lowest mantissa bit set when inexact ("round to
// odd"): a later rounding to a format with at least 2 fewer mantissa bits is then correct.
inline float round_to_odd_float(double v) {
  const float f = static_cast<float>(v);
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (static_cast<double>(f) != v && !std::isnan(v)) {
    // One step towards zero when the nearest float overshot (an infinity becomes FLT_MAX).
    if (std::fabs(static_cast<double>(f)) > std::fabs(v)) --u;
    u |= 1u;
  }
  return std::bit_cast<float>(u);
}

// out[j] = round(w[j] + delta[j]) in the output dtype, the dtype's branch outside the loop.
void store_sum(io::Dtype dtype, const float* w, const double* delta, std::int64_t n,
               std::byte* out) {
  switch (dtype) {
    case io::Dtype::F32:
      for (std::int64_t j = 0; j < n; ++j) {
        const float f = static_cast<float>(static_cast<double>(w[j]) + delta[j]);
        std::memcpy(out + 4 * j, &f, 4);
      }
      return;
    case io::Dtype::BF16:
      for (std::int64_t j = 0; j < n; ++j) {
        const std::uint16_t h =
            io::float_to_bf16(round_to_odd_float(static_cast<double>(w[j]) + delta[j]));
        std::memcpy(out + 2 * j, &h, 2);
      }
      return;
    case io::Dtype::F16:
      for (std::int64_t j = 0; j < n; ++j) {
        const std::uint16_t h =
            io::float_to_f16(round_to_odd_float(static_cast<double>(w[j]) + delta[j]));
        std::memcpy(out + 2 * j, &h, 2);
      }
      return;
    case io::Dtype::U8:
    case io::Dtype::I8:
      throw std::logic_error("merge: integer output dtype");
  }
}

const char* torch_dtype_name(io::Dtype d) {
  switch (d) {
    case io::Dtype::F32:
      return "float32";
    case io::Dtype::F16:
      return "float16";
    case io::Dtype::BF16:
      return "bfloat16";
    case io::Dtype::U8:
      return "uint8";
    case io::Dtype::I8:
      return "int8";
  }
  return "?";
}

bool is_f16_infinity(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return (h & 0x7fffu) == 0x7c00u;
}

[[noreturn]] void f16_overflow(const std::string& name) {
  throw UserError("tensor '" + name +
                  "' has values beyond float16's range (|x| > 65504) after the merge; use "
                  "--dtype bf16 or --dtype f32");
}

// Runs fn(begin, end) over [0, n) split into up to `threads` contiguous parts.
void parallel_ranges(std::int64_t n, int threads,
                     const std::function<void(std::int64_t, std::int64_t)>& fn) {
  const std::int64_t parts = std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n));
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(parts));
  for (std::int64_t p = 0; p < parts; ++p) {
    const std::int64_t begin = n * p / parts, end = n * (p + 1) / parts;
    auto body = [&, p, begin, end] {
      try {
        fn(begin, end);
      } catch (...) {
        errors[static_cast<std::size_t>(p)] = std::current_exception();
      }
    };
    if (p + 1 == parts)
      body();
    else
      workers.emplace_back(body);
  }
  for (std::thread& t : workers) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

// One tensor of the output and where it comes from.
struct OutputTensor {
  const io::TensorInfo* source = nullptr;
  io::Dtype dtype = io::Dtype::F32;
  const io::LoraTarget* target = nullptr;  // set for adapted projections
  std::int64_t layer = -1;
};

}  // namespace

std::int64_t merge_a_stride(std::int64_t in_features) {
  return (in_features + kTile - 1) / kTile * kTile;
}

float round_to_f32(double v) { return static_cast<float>(v); }
std::uint16_t round_to_bf16(double v) { return io::float_to_bf16(round_to_odd_float(v)); }
std::uint16_t round_to_f16(double v) { return io::float_to_f16(round_to_odd_float(v)); }

void store_rounded(io::Dtype dtype, double v, std::byte* out) {
  switch (dtype) {
    case io::Dtype::F32: {
      const float f = round_to_f32(v);
      std::memcpy(out, &f, 4);
      return;
    }
    case io::Dtype::BF16: {
      const std::uint16_t h = round_to_bf16(v);
      std::memcpy(out, &h, 2);
      return;
    }
    case io::Dtype::F16: {
      const std::uint16_t h = round_to_f16(v);
      std::memcpy(out, &h, 2);
      return;
    }
    case io::Dtype::U8:
    case io::Dtype::I8:
      throw std::logic_error("store_rounded: integer output dtype");
  }
}

void merge_rows(const WeightReader& weight, std::int64_t in_features, std::int64_t rank,
                const double* a, std::int64_t a_stride, const float* b, double scale,
                io::Dtype out_dtype, std::int64_t row_begin, std::int64_t row_end,
                std::span<std::byte> out) {
  const std::size_t esize = io::dtype_size(out_dtype);
  std::vector<double> scaled_b(static_cast<std::size_t>(rank));
  alignas(64) double delta[kTile];
  float w[kTile];
  for (std::int64_t c0 = 0; c0 < in_features; c0 += kTile) {
    const std::int64_t n = std::min(kTile, in_features - c0);
    for (std::int64_t row = row_begin; row < row_end; ++row) {
      for (std::int64_t k = 0; k < rank; ++k)
        scaled_b[static_cast<std::size_t>(k)] = scale * static_cast<double>(b[row * rank + k]);
      // delta = sum_k (scale B[row, k]) A[k, c0:c0+kTile]; A's rows are zero-padded to whole
      // tiles, so the loops have a fixed length the compiler vectorises.
      std::fill(delta, delta + kTile, 0.0);
      std::int64_t k = 0;
      for (; k + 4 <= rank; k += 4) {
        const double* a0 = a + k * a_stride + c0;
        const double *a1 = a0 + a_stride, *a2 = a1 + a_stride, *a3 = a2 + a_stride;
        const double s0 = scaled_b[k], s1 = scaled_b[k + 1], s2 = scaled_b[k + 2],
                     s3 = scaled_b[k + 3];
        for (std::int64_t j = 0; j < kTile; ++j)
          delta[j] += s0 * a0[j] + s1 * a1[j] + s2 * a2[j] + s3 * a3[j];
      }
      for (; k < rank; ++k) {
        const double* ak = a + k * a_stride + c0;
        const double s = scaled_b[static_cast<std::size_t>(k)];
        for (std::int64_t j = 0; j < kTile; ++j) delta[j] += s * ak[j];
      }
      const std::int64_t first = row * in_features + c0;
      weight(first, std::span<float>(w, static_cast<std::size_t>(n)));
      store_sum(out_dtype, w, delta, n, out.data() + static_cast<std::size_t>(first) * esize);
    }
  }
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& flag) {
  std::size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) ||
                                  text[digits] == '.'))
    ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {
      {"", 1.0},      {"b", 1.0},          {"kb", 1e3},         {"mb", 1e6},
      {"gb", 1e9},    {"tb", 1e12},        {"kib", 1024.0},     {"mib", 1048576.0},
      {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  const auto it = units.find(unit);
  double value = 0.0;
  bool ok = digits > 0 && it != units.end();
  if (ok) {
    try {
      std::size_t used = 0;
      value = std::stod(text.substr(0, digits), &used) * it->second;
      ok = used == digits;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok || !(value >= 1.0) || value > 1e18)
    throw UserError(flag + " \"" + text + "\": give a positive size such as 5GB, 500MB or 2GiB");
  return static_cast<std::uint64_t>(value);
}

const std::vector<std::string>& merge_copied_file_names() {
  static const std::vector<std::string> names = {
      "tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
      "generation_config.json", "vocab.json",       "merges.txt",
      "tokenizer.model",   "added_tokens.json",     "chat_template.jinja",
      "chat_template.json"};
  return names;
}

MergeSummary merge_adapter(const MergeOptions& o) {
  const int threads =
      o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  // ---- everything is checked before the output directory is touched ----
  const ModelConfig config = load_model_config(o.model_dir);
  const io::SafetensorsCheckpoint checkpoint = io::SafetensorsCheckpoint::open(o.model_dir);
  // A bitsandbytes 4-bit checkpoint holds no 16-bit projection weights to merge into, and a
  // merged model written in its layout would need re-quantising the sums: refused.
  if (config.bnb_4bit || is_bnb_checkpoint(checkpoint))
    throw UserError(o.model_dir.string() +
                    ": is a bitsandbytes quantised checkpoint (quantization_config in "
                    "config.json); merge into the model's 16-bit release instead (e.g. "
                    "Qwen/Qwen3-0.6B for unsloth/Qwen3-0.6B-bnb-4bit), with --from nf4 to merge "
                    "into the NF4 weights training saw");
  const io::LoraTargetShapes shapes = lora_target_shapes(config);
  const io::AdapterFile adapter = io::AdapterFile::open(o.adapter_dir, shapes);
  const double scale = adapter.config().scaling();

  std::map<std::string, OutputTensor> outputs;
  for (const std::string& name : checkpoint.names()) {
    const io::TensorInfo* info = checkpoint.find(name);
    outputs[name] = {info, o.dtype.value_or(info->dtype), nullptr, -1};
  }
  const io::TensorInfo* first_target = nullptr;
  for (std::int64_t layer = 0; layer < adapter.num_layers(); ++layer) {
    for (const io::LoraTarget& t : adapter.targets()) {
      const std::string name = "model.layers." + std::to_string(layer) + "." + t.module_path +
                               ".weight";
      auto it = outputs.find(name);
      if (it == outputs.end())
        throw UserError(o.model_dir.string() + ": has no tensor '" + name +
                        "', which the adapter adapts; the checkpoint is incomplete or does not "
                        "match its config.json");
      const std::vector<std::int64_t> want = {t.out_features, t.in_features};
      if (it->second.source->shape != want)
        throw UserError(o.model_dir.string() + ": tensor '" + name + "' has shape " +
                        io::shape_text(it->second.source->shape) + " but config.json (and the "
                        "adapter) imply " + io::shape_text(want) +
                        "; the weights and config.json belong to different models");
      it->second.target = &t;
      it->second.layer = layer;
      if (!first_target) first_target = it->second.source;
    }
  }

  std::error_code ec;
  const bool out_exists = fs::exists(o.out_dir, ec);
  if (out_exists && (fs::equivalent(o.out_dir, o.model_dir, ec) ||
                     fs::equivalent(o.out_dir, o.adapter_dir, ec)))
    throw UserError("--out " + o.out_dir.string() +
                    " is the model or adapter directory itself; write the merged model elsewhere");
  if (o.overwrite && io::directory_has_entries(o.out_dir) &&
      !fs::exists(o.out_dir / "config.json", ec))
    throw UserError("--out " + o.out_dir.string() +
                    " is not empty and holds no config.json; --overwrite replaces only a model "
                    "directory (such as an earlier merge): choose another path");
  io::AtomicDirectory out(o.out_dir, o.overwrite);

  // ---- tensors, in the order the safetensors writer lays them out (element size, then
  // name), so that a tensor's turn to be produced tells which source pages are done with ----
  std::vector<std::pair<std::string, OutputTensor>> order(outputs.begin(), outputs.end());
  std::stable_sort(order.begin(), order.end(), [](const auto& x, const auto& y) {
    const std::size_t sx = io::dtype_size(x.second.dtype), sy = io::dtype_size(y.second.dtype);
    return sx != sy ? sx > sy : x.first < y.first;
  });
  std::int64_t total_targets = 0;
  for (const auto& [name, t] : order) total_targets += t.target ? 1 : 0;

  MergeSummary summary;
  summary.scale = scale;
  summary.rank = adapter.config().r;
  std::int64_t merged_done = 0;
  const std::int64_t report_every = std::max<std::int64_t>(1, (total_targets + 9) / 10);
  std::size_t released = 0;
  auto release_until = [&](std::size_t end) {
    for (; released < end; ++released) checkpoint.release(order[released].first);
  };

  std::vector<io::TensorToWrite> tensors;
  for (std::size_t index = 0; index < order.size(); ++index) {
    const std::string& name = order[index].first;
    const OutputTensor& t = order[index].second;
    const io::TensorView view = checkpoint.tensor(name);
    io::TensorToWrite w{name, t.dtype, t.source->shape, {}, {}};
    summary.tensor_bytes += w.byte_size();
    if (t.target) {
      ++summary.merged;
      w.fill = [&, index, view, t](std::span<std::byte> bytes) {
        release_until(index);
        const std::int64_t rank = adapter.config().r, in = t.target->in_features;
        const std::int64_t stride = (in + kTile - 1) / kTile * kTile;
        std::vector<double> a(static_cast<std::size_t>(rank * stride), 0.0);
        {
          const io::TensorView a_view = adapter.factor(t.layer, *t.target, 'A');
          std::vector<float> row(static_cast<std::size_t>(in));
          for (std::int64_t k = 0; k < rank; ++k) {
            a_view.to_float(row, k * in);
            std::copy(row.begin(), row.end(), a.begin() + k * stride);
          }
        }
        const std::vector<float> b = adapter.factor(t.layer, *t.target, 'B').to_float();
        std::optional<quant::Nf4Tensor> quantised;
        WeightReader reader = [&view](std::int64_t first, std::span<float> out) {
          view.to_float(out, first);
        };
        if (o.base == MergeBase::nf4) {
          quantised = nf4_quantize_tensor(view, {.double_quant = o.double_quant, .threads = threads});
          reader = [&quantised](std::int64_t first, std::span<float> out) {
            quant::nf4_dequantize(*quantised, first, out);
          };
        }
        parallel_ranges(t.target->out_features, threads, [&](std::int64_t r0, std::int64_t r1) {
          merge_rows(reader, in, rank, a.data(), stride, b.data(), scale, t.dtype, r0, r1, bytes);
        });
        if (t.dtype == io::Dtype::F16) {
          std::vector<float> src(static_cast<std::size_t>(in));
          for (std::int64_t row = 0; row < t.target->out_features; ++row)
            for (std::int64_t c = 0; c < in; ++c)
              if (is_f16_infinity(bytes.data() + 2 * (row * in + c))) {
                view.to_float(std::span<float>(src.data(), 1), row * in + c);
                if (std::isfinite(src[0])) f16_overflow(name);
              }
        }
        checkpoint.release(name);
        released = index + 1;
        ++merged_done;
        if (o.progress && (merged_done % report_every == 0 || merged_done == total_targets))
          o.progress("merged " + std::to_string(merged_done) + "/" +
                     std::to_string(total_targets) + " projections");
      };
    } else if (t.dtype == view.dtype()) {
      ++summary.copied;
      w.data = view.bytes();  // bit-exact, straight from the mapped file
    } else {
      ++summary.copied;
      w.fill = [&, index, view, t](std::span<std::byte> bytes) {
        release_until(index);
        const std::size_t esize = io::dtype_size(t.dtype);
        const std::int64_t n = view.numel();
        std::vector<float> chunk(static_cast<std::size_t>(std::min<std::int64_t>(n, 1 << 16)));
        for (std::int64_t first = 0; first < n; first += static_cast<std::int64_t>(chunk.size())) {
          const std::size_t m =
              static_cast<std::size_t>(std::min<std::int64_t>(n - first, chunk.size()));
          view.to_float(std::span<float>(chunk.data(), m), first);
          for (std::size_t j = 0; j < m; ++j) {
            std::byte* dst = bytes.data() + (static_cast<std::size_t>(first) + j) * esize;
            store_rounded(t.dtype, chunk[j], dst);
            if (t.dtype == io::Dtype::F16 && std::isfinite(chunk[j]) && is_f16_infinity(dst))
              f16_overflow(view.name());
          }
        }
        checkpoint.release(view.name());
        released = index + 1;
      };
    }
    tensors.push_back(std::move(w));
  }
  for (const fs::path& p : io::write_safetensors_sharded(out.temp(), std::move(tensors),
                                                         o.max_shard_bytes))
    summary.weight_files.push_back(p.filename().string());

  // config.json: unchanged but for the dtype (key order kept; "dtype" is the newer spelling).
  const fs::path config_path = o.model_dir / "config.json";
  nlohmann::ordered_json cj;
  try {
    cj = nlohmann::ordered_json::parse(io::read_text_file(config_path));
  } catch (const nlohmann::json::exception& e) {
    throw UserError(config_path.string() + ": invalid JSON (" + e.what() + ")");
  }
  summary.torch_dtype = torch_dtype_name(
      o.dtype ? *o.dtype : (first_target ? first_target->dtype : io::Dtype::F32));
  cj["torch_dtype"] = summary.torch_dtype;
  if (cj.contains("dtype")) cj["dtype"] = summary.torch_dtype;
  io::write_file_atomic(out.temp() / "config.json", cj.dump(2) + "\n");
  summary.copied_files.push_back("config.json");

  for (const std::string& name : merge_copied_file_names()) {
    const fs::path source = o.model_dir / name;
    if (!fs::is_regular_file(source, ec)) continue;
    io::write_file_atomic(out.temp() / name, io::read_text_file(source));
    summary.copied_files.push_back(name);
  }
  out.commit();
  return summary;
}

}  // namespace forja::model
