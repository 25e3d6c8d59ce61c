// Reading bitsandbytes 4-bit checkpoints into forja's NF4 layout (see model/bnb4.h for the
// on-disk format and the blocksize conversion).
#include "model/bnb4.h"

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace forja::model {
namespace {

using json = nlohmann::json;

constexpr const char* kUse16Bit =
    "give forja the model's 16-bit release instead (e.g. Qwen/Qwen3-0.6B rather than a "
    "...-bnb-4bit or ...-8bit repository): it quantises to NF4 itself";

// A stored companion tensor of a bnb weight, checked for presence and dtype.
io::TensorView companion(const io::SafetensorsCheckpoint& ck, const std::string& weight,
                         const std::string& suffix, io::Dtype dtype) {
  const std::string name = weight + suffix;
  const io::TensorInfo* info = ck.find(name);
  if (!info)
    throw UserError(ck.path_of(weight).string() + ": bitsandbytes 4-bit weight '" + weight +
                    "' lacks its tensor '" + name +
                    "'; the checkpoint is incomplete: re-download it");
  if (info->dtype != dtype)
    throw UserError(ck.path_of(name).string() + ": tensor '" + name + "' has dtype " +
                    io::dtype_name(info->dtype) + " but bitsandbytes stores it as " +
                    io::dtype_name(dtype) + "; the checkpoint is damaged: re-download it");
  return ck.tensor(name);
}

std::vector<float> floats_of(const io::TensorView& v) { return v.to_float(); }

// The quant-state JSON of a bnb NF4 weight, parsed, with the keys forja relies on checked.
struct QuantState {
  std::int64_t blocksize = 0;
  std::vector<std::int64_t> shape;
  bool nested = false;
  std::int64_t nested_blocksize = 0;
  float nested_offset = 0.0f;
};

QuantState read_quant_state(const io::SafetensorsCheckpoint& ck, const std::string& weight) {
  const std::string name = weight + kBnbNf4StateSuffix;
  const io::TensorView view = companion(ck, weight, kBnbNf4StateSuffix, io::Dtype::U8);
  const std::string file = ck.path_of(name).string();
  auto bad = [&](const std::string& problem) -> UserError {
    return UserError(file + ": tensor '" + name + "' (bitsandbytes quant state) " + problem +
                     "; the checkpoint is damaged or from an unknown bitsandbytes version: "
                     "re-download it, or " + kUse16Bit);
  };
  const std::span<const std::byte> bytes = view.bytes();
  json j;
  try {
    j = json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  } catch (const json::exception& e) {
    throw bad(std::string("is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw bad("is not a JSON object");
  auto integer = [&](const char* key) -> std::int64_t {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() <= 0)
      throw bad(std::string("has no positive integer \"") + key + "\"");
    return j[key].get<std::int64_t>();
  };
  if (!j.contains("quant_type") || j["quant_type"] != "nf4")
    throw bad("does not say \"quant_type\": \"nf4\"");
  QuantState q;
  q.blocksize = integer("blocksize");
  if (!j.contains("shape") || !j["shape"].is_array() || j["shape"].empty()) throw bad("has no \"shape\" list");
  // A weight has at least one element and fewer than 2^48 (the fuzz target found [0, 64]).
  std::int64_t numel = 1;
  for (const json& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 1)
      throw bad("has a \"shape\" entry that is not a positive integer");
    const std::int64_t n = d.get<std::int64_t>();
    if (n > (std::int64_t(1) << 48) / numel) throw bad("has a \"shape\" of more elements than any weight");
    numel *= n;
    q.shape.push_back(n);
  }
  q.nested = ck.find(weight + ".nested_absmax") != nullptr;
  if (q.nested) {
    q.nested_blocksize = integer("nested_blocksize");
    if (!j.contains("nested_offset") || !j["nested_offset"].is_number())
      throw bad("has no number \"nested_offset\" although the weight is double-quantised");
    // json.dumps writes the fp32 offset widened to a double with all its digits: the float
    // conversion gives back the stored fp32 exactly.
    q.nested_offset = static_cast<float>(j["nested_offset"].get<double>());
  }
  return q;
}

}  // namespace

std::optional<BnbQuantConfig> parse_quantization_config(const json& config,
                                                        const std::string& source) {
  if (!config.contains("quantization_config") || config["quantization_config"].is_null())
    return std::nullopt;
  const json& q = config["quantization_config"];
  auto fail = [&](const std::string& problem) -> UserError {
    return UserError(source + ": quantization_config " + problem);
  };
  if (!q.is_object()) throw fail("is not a JSON object");
  auto flag = [&](const char* key) {
    if (!q.contains(key) || q[key].is_null()) return false;
    if (!q[key].is_boolean()) throw fail(std::string("\"") + key + "\" must be true or false");
    return q[key].get<bool>();
  };
  auto text = [&](const char* key, const char* fallback) {
    if (!q.contains(key) || q[key].is_null()) return std::string(fallback);
    if (!q[key].is_string()) throw fail(std::string("\"") + key + "\" must be a string");
    return q[key].get<std::string>();
  };
  const std::string method = text("quant_method", "bitsandbytes");
  if (method != "bitsandbytes")
    throw fail("has quant_method \"" + method +
               "\", which forja does not read (it reads bitsandbytes 4-bit NF4 checkpoints); " +
               kUse16Bit);
  if (flag("load_in_8bit"))
    throw fail("says load_in_8bit: an 8-bit bitsandbytes checkpoint (int8 weights + SCB "
               "scales), which forja does not train on; " + std::string(kUse16Bit) +
               ", or use the model's bnb-4bit (NF4) release");
  if (!flag("load_in_4bit"))
    throw fail("says neither load_in_4bit nor load_in_8bit; forja reads bitsandbytes 4-bit NF4 "
               "checkpoints: " + std::string(kUse16Bit));
  const std::string type = text("bnb_4bit_quant_type", "fp4");  // BitsAndBytesConfig's default
  if (type != "nf4")
    throw fail("has bnb_4bit_quant_type \"" + type +
               "\"; forja trains on NF4 only (QLoRA's type, and its own): " + kUse16Bit +
               ", or use an NF4 (bnb_4bit_quant_type=\"nf4\") quantisation of it");
  BnbQuantConfig c;
  c.double_quant = flag("bnb_4bit_use_double_quant");
  c.compute_dtype = text("bnb_4bit_compute_dtype", "");
  c.quant_storage = text("bnb_4bit_quant_storage", "uint8");
  if (q.contains("llm_int8_skip_modules") && q["llm_int8_skip_modules"].is_array())
    for (const json& m : q["llm_int8_skip_modules"])
      if (m.is_string()) c.skip_modules.push_back(m.get<std::string>());
  return c;
}

const std::vector<std::string>& bnb4_state_suffixes() {
  static const std::vector<std::string> s = {".absmax", ".quant_map", ".nested_absmax",
                                             ".nested_quant_map", kBnbNf4StateSuffix};
  return s;
}

bool is_bnb4_weight(const io::SafetensorsCheckpoint& ck, const std::string& weight) {
  if (ck.find(weight + ".quant_state.bitsandbytes__fp4"))
    throw UserError(ck.path_of(weight).string() + ": weight '" + weight +
                    "' is bitsandbytes fp4; forja trains on NF4 only: " + kUse16Bit +
                    ", or use an NF4 quantisation of it");
  const io::TensorInfo* w = ck.find(weight);
  if (ck.find(weight + ".SCB") || (w && w->dtype == io::Dtype::I8))
    throw UserError(ck.path_of(weight).string() + ": weight '" + weight +
                    "' is bitsandbytes 8-bit (int8 + SCB scales), which forja does not train "
                    "on; " + std::string(kUse16Bit) + ", or use the model's bnb-4bit (NF4) release");
  return ck.find(weight + kBnbNf4StateSuffix) != nullptr;
}

bool is_bnb_checkpoint(const io::SafetensorsCheckpoint& ck) {
  for (const std::string& name : ck.names())
    if (name.ends_with(kBnbNf4StateSuffix) || name.ends_with(".quant_state.bitsandbytes__fp4") ||
        name.ends_with(".SCB"))
      return true;
  return false;
}

std::vector<std::int64_t> bnb4_weight_shape(const io::SafetensorsCheckpoint& ck,
                                            const std::string& weight) {
  return read_quant_state(ck, weight).shape;
}

quant::Nf4Tensor read_bnb4_weight(const io::SafetensorsCheckpoint& ck, const std::string& weight,
                           const std::vector<std::int64_t>& expected) {
  const QuantState qs = read_quant_state(ck, weight);
  const std::string file = ck.path_of(weight).string();
  if (qs.shape != expected)
    throw UserError(file + ": bitsandbytes weight '" + weight + "' has shape " +
                    io::shape_text(qs.shape) + " (its quant state) but config.json implies " +
                    io::shape_text(expected) + "; the weights and config.json belong to different models");
  std::int64_t n = 1;
  for (std::int64_t d : qs.shape) n *= d;

  // The packed codes: whatever dtype the storage was viewed as, the bytes are the codes.
  const io::TensorView packed = ck.tensor(weight);
  if (packed.bytes().size() != static_cast<std::size_t>((n + 1) / 2))
    throw UserError(file + ": bitsandbytes weight '" + weight + "' holds " +
                    std::to_string(packed.bytes().size()) + " bytes but shape " +
                    io::shape_text(qs.shape) + " packs into " + std::to_string((n + 1) / 2) +
                    "; the checkpoint is damaged: re-download it");

  // The code table must be NF4's: the kernels decode with those 16 values.
  const std::vector<float> quant_map = floats_of(companion(ck, weight, ".quant_map", io::Dtype::F32));
  bool nf4_table = quant_map.size() == quant::kNf4Code.size();
  for (std::size_t i = 0; nf4_table && i < quant_map.size(); ++i)
    nf4_table = std::bit_cast<std::uint32_t>(quant_map[i]) == std::bit_cast<std::uint32_t>(quant::kNf4Code[i]);
  if (!nf4_table)
    throw UserError(file + ": tensor '" + weight + ".quant_map' is not the 16-value NF4 table "
                    "(bitsandbytes get_4bit_type(\"nf4\")); forja decodes NF4 only: " + kUse16Bit);

  // Blocks of 64*m become m blocks of 64 with the same absmax (exact).
  if (qs.blocksize % quant::kNf4BlockSize != 0)
    throw UserError(file + ": bitsandbytes weight '" + weight + "' uses blocksize " +
                    std::to_string(qs.blocksize) + "; forja's NF4 uses blocks of 64 and reads "
                    "blocksizes that are multiples of 64: " + kUse16Bit);
  const std::int64_t m = qs.blocksize / quant::kNf4BlockSize;
  const std::int64_t stored_blocks = (n + qs.blocksize - 1) / qs.blocksize;

  quant::Nf4Tensor t;
  t.shape = qs.shape;
  t.numel = n;
  t.packed.resize(static_cast<std::size_t>((n + 1) / 2));
  std::memcpy(t.packed.data(), packed.bytes().data(), t.packed.size());
  const std::int64_t blocks = t.num_blocks();

  if (!qs.nested) {
    const std::vector<float> absmax = floats_of(companion(ck, weight, ".absmax", io::Dtype::F32));
    if (static_cast<std::int64_t>(absmax.size()) != stored_blocks)
      throw UserError(file + ": tensor '" + weight + ".absmax' has " +
                      std::to_string(absmax.size()) + " values but " + io::shape_text(qs.shape) +
                      " in blocks of " + std::to_string(qs.blocksize) + " needs " +
                      std::to_string(stored_blocks) + "; the checkpoint is damaged: re-download it");
    t.absmax.resize(static_cast<std::size_t>(blocks));
    for (std::int64_t b = 0; b < blocks; ++b)
      t.absmax[static_cast<std::size_t>(b)] = absmax[static_cast<std::size_t>(b / m)];
    return t;
  }

  // Double quantisation: 8-bit absmax codes, one fp32 nested absmax per nested block, offset.
  const io::TensorView codes = companion(ck, weight, ".absmax", io::Dtype::U8);
  const std::vector<float> nested = floats_of(companion(ck, weight, ".nested_absmax", io::Dtype::F32));
  t.code8 = floats_of(companion(ck, weight, ".nested_quant_map", io::Dtype::F32));
  if (t.code8.size() != 256)
    throw UserError(file + ": tensor '" + weight + ".nested_quant_map' has " +
                    std::to_string(t.code8.size()) + " values, not the 256 of an 8-bit map; the "
                    "checkpoint is damaged: re-download it");
  const std::int64_t nested_blocks = (stored_blocks + qs.nested_blocksize - 1) / qs.nested_blocksize;
  if (codes.numel() != stored_blocks || static_cast<std::int64_t>(nested.size()) != nested_blocks)
    throw UserError(file + ": bitsandbytes weight '" + weight + "' has " +
                    std::to_string(codes.numel()) + " absmax codes and " +
                    std::to_string(nested.size()) + " nested absmax values, but " +
                    io::shape_text(qs.shape) + " in blocks of " + std::to_string(qs.blocksize) +
                    " (nested " + std::to_string(qs.nested_blocksize) + ") needs " +
                    std::to_string(stored_blocks) + " and " + std::to_string(nested_blocks) +
                    "; the checkpoint is damaged: re-download it");
  // forja's nested block k covers its blocks [256k, 256k + 256), i.e. stored blocks
  // [256k/m, 256(k+1)/m): one stored nested block when nested_blocksize * m is a multiple of 256.
  if ((qs.nested_blocksize * m) % quant::kNf4NestedBlockSize != 0)
    throw UserError(file + ": bitsandbytes weight '" + weight + "' uses blocksize " +
                    std::to_string(qs.blocksize) + " with nested_blocksize " +
                    std::to_string(qs.nested_blocksize) + ", which forja's layout (blocks of 64, "
                    "nested blocks of 256) cannot hold exactly: " + kUse16Bit);
  const std::span<const std::byte> code_bytes = codes.bytes();
  t.double_quant = true;
  t.absmax_offset = qs.nested_offset;
  t.absmax_q.resize(static_cast<std::size_t>(blocks));
  for (std::int64_t b = 0; b < blocks; ++b)
    t.absmax_q[static_cast<std::size_t>(b)] =
        static_cast<std::uint8_t>(code_bytes[static_cast<std::size_t>(b / m)]);
  const std::int64_t forja_nested = (blocks + quant::kNf4NestedBlockSize - 1) / quant::kNf4NestedBlockSize;
  t.nested_absmax.resize(static_cast<std::size_t>(forja_nested));
  for (std::int64_t k = 0; k < forja_nested; ++k)
    t.nested_absmax[static_cast<std::size_t>(k)] =
        nested[static_cast<std::size_t>(k * quant::kNf4NestedBlockSize / m / qs.nested_blocksize)];
  return t;
}

}  // namespace forja::model
