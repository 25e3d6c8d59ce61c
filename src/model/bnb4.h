// bitsandbytes 4-bit checkpoints (the "*-bnb-4bit" repositories, saved by transformers with
// BitsAndBytesConfig(load_in_4bit=True)): their projection weights are already NF4, and forja
// trains on those codes as they are, with no re-quantisation (docs/formats.md §3.5).
//
// On disk, for a projection weight P.weight of logical shape [out, in] (BNB-F QuantState.as_dict
// with packed=True; transformers' bnb-4bit serialisation):
//   P.weight                                  uint8 [(n+1)/2, 1]: two codes a byte, element 2k in
//                                             the HIGH nibble (the bytes may be viewed as another
//                                             dtype when bnb_4bit_quant_storage is not uint8)
//   P.weight.absmax                           F32 [ceil(n/blocksize)], or U8 codes with double quant
//   P.weight.quant_map                        F32 [16], the NF4 code table
//   P.weight.nested_absmax                    F32 [ceil(blocks/nested_blocksize)] (double quant)
//   P.weight.nested_quant_map                 F32 [256], the signed dynamic map (double quant)
//   P.weight.quant_state.bitsandbytes__nf4    U8: UTF-8 JSON {"quant_type": "nf4", "blocksize": 64,
//                                             "dtype": "bfloat16", "shape": [out, in], and with
//                                             double quant "nested_blocksize": 256,
//                                             "nested_dtype": "float32", "nested_offset": <float>}
// and config.json carries "quantization_config": {"quant_method": "bitsandbytes",
// "load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": ...,
// "bnb_4bit_compute_dtype": ..., "llm_int8_skip_modules": [...]}. Modules in the skip list
// (lm_head; some layers in unsloth's "dynamic" quants) stay 16-bit: forja quantises those itself.
//
// forja's NF4 layout (quant/nf4.h) is bitsandbytes' with blocks of 64, so the codes and the
// absmax are taken as stored. A blocksize of 64*m (128 on ROCm builds, 256) is converted exactly:
// each stored absmax (or absmax code) is repeated for the m blocks of 64 it covers; with double
// quantisation the nested absmax is repeated likewise, which is exact whenever the nested block
// (nested_blocksize stored blocks) spans whole groups of 256 blocks of 64. fp4, 8-bit (int8 +
// SCB) and other quantisation methods are refused with the fix.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/safetensors.h"
#include "quant/nf4.h"

namespace forja::model {

// config.json's quantization_config, when it describes a bitsandbytes 4-bit NF4 checkpoint.
struct BnbQuantConfig {
  bool double_quant = false;  // bnb_4bit_use_double_quant
  std::string compute_dtype;  // bnb_4bit_compute_dtype ("bfloat16", ...; "" when absent)
  std::string quant_storage;  // bnb_4bit_quant_storage ("uint8" when absent)
  std::vector<std::string> skip_modules;  // llm_int8_skip_modules (left 16-bit)
};

// Reads `quantization_config` from a parsed config.json: nullopt when there is none, the
// settings for a bitsandbytes 4-bit NF4 checkpoint, and a UserError naming `source` and the fix
// for anything forja cannot train on (8-bit, fp4, GPTQ/AWQ/other methods).
std::optional<BnbQuantConfig> parse_quantization_config(const nlohmann::json& config,
                                                        const std::string& source);

// Suffixes of the quantisation-state tensors that accompany a bnb 4-bit weight "P.weight".
inline constexpr const char* kBnbNf4StateSuffix = ".quant_state.bitsandbytes__nf4";
const std::vector<std::string>& bnb4_state_suffixes();  // ".absmax", ".quant_map", ...

// True when `weight_name` (e.g. model.layers.0.self_attn.q_proj.weight) is stored as bnb NF4.
// UserError naming the file and the fix when it is stored as bnb fp4 or 8-bit (int8 + SCB).
bool is_bnb4_weight(const io::SafetensorsCheckpoint& ck, const std::string& weight_name);

// True when any weight of the checkpoint is stored in a bitsandbytes format.
bool is_bnb_checkpoint(const io::SafetensorsCheckpoint& ck);

// Reads a bnb NF4 weight into forja's layout (blocks of 64), checking everything against the
// format above and the logical shape `expected` ([out, in] from config.json): UserError naming
// the file, the tensor and the fix on any mismatch. Copies the packed codes (numel/2 bytes).
quant::Nf4Tensor read_bnb4_weight(const io::SafetensorsCheckpoint& ck, const std::string& weight_name,
                           const std::vector<std::int64_t>& expected);

// The logical shape that the quant-state JSON of a bnb NF4 weight records (validated).
std::vector<std::int64_t> bnb4_weight_shape(const io::SafetensorsCheckpoint& ck,
                                            const std::string& weight_name);

}  // namespace forja::model
