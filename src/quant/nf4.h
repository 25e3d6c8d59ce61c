// The NF4 codec on the CPU, bit-compatible with bitsandbytes (docs/formats.md §3): the frozen
// base weights of QLoRA are stored as 4-bit NormalFloat codes with one absmax per block of 64,
// optionally with the absmax values themselves quantised to 8 bits ("double quantisation").
//
// ============================== PACKED LAYOUT (the GPU kernels read this) =====================
// A weight W of shape [out, in] (any shape: only numel matters) is flattened in row-major order:
// element e = row * in + col, e in [0, n), n = numel.
//
//   blocks:  block b holds elements [64*b, 64*b + 64); num_blocks = ceil(n / 64); the last
//            block may be partial. Because 64 is even, no byte straddles two blocks.
//   packed:  uint8[(n + 1) / 2]. Byte k holds elements 2k and 2k+1:
//               packed[k] = (q[2k] << 4) | q[2k+1]      -- EVEN element in the HIGH nibble
//            q[e] is a 4-bit index into kNf4Code. For odd n the last low nibble is padding
//            (the code of 0.0, i.e. 7, as bitsandbytes' CUDA kernel writes); never read it.
//   absmax without double quantisation:
//            float32[num_blocks], absmax[b] = max |W[e]| over block b (exact, from the source
//            values widened to fp32).
//   absmax with double quantisation (the default, as in QLoRA):
//            absmax_q:      uint8[num_blocks], an index into dynamic_map_signed() (or into the
//                           tensor's own code8 table, read from a bitsandbytes checkpoint)
//            nested_absmax: float32[ceil(num_blocks / 256)], one per block of 256 absmax values
//            absmax_offset: float32 scalar, the mean of the fp32 absmax values
//            absmax[b] = dynamic_map_signed()[absmax_q[b]] * nested_absmax[b / 256] + absmax_offset
//            (fp32 multiply, then fp32 add: the order bitsandbytes uses).
//   dequantised value:
//            W'[e] = kNf4Code[q[e]] * absmax[e / 64]            (fp32 multiply)
//
// Quantisation of one block (bitsandbytes' CUDA kQuantizeBlockwise / dQuantizeNF4):
//   inv = 1.0f / absmax[b];  s = W[e] * inv (fp32);  q[e] = number of kNf4Thresholds t with s > t
//   (strict '>', so a value exactly on a midpoint takes the lower code). An all-zero block gives
//   NaN scaled values, hence q = 0 (code -1.0): it dequantises to exactly 0 with fp32 absmax,
//   and with double quantisation to -(decoded absmax), i.e. within the absmax error of 0, as
//   bitsandbytes does too.
// ===============================================================================================
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>


namespace forja::quant {

inline constexpr std::int64_t kNf4BlockSize = 64;
inline constexpr std::int64_t kNf4NestedBlockSize = 256;

// The 16 NF4 values, index -> value (BNB get_4bit_type("nf4")).
inline constexpr std::array<float, 16> kNf4Code = {-1.0f,
                                                   -0.6961928009986877f,
                                                   -0.5250730514526367f,
                                                   -0.39491748809814453f,
                                                   -0.28444138169288635f,
                                                   -0.18477343022823334f,
                                                   -0.09105003625154495f,
                                                   0.0f,
                                                   0.07958029955625534f,
                                                   0.16093020141124725f,
                                                   0.24611230194568634f,
                                                   0.33791524171829224f,
                                                   0.44070982933044434f,
                                                   0.5626170039176941f,
                                                   0.7229568362236023f,
                                                   1.0f};

// Decision thresholds between codes i and i+1 (the midpoints, as float literals in dQuantizeNF4).
inline constexpr std::array<float, 15> kNf4Thresholds = {
    -0.8480964004993439f,  -0.6106329262256622f,  -0.4599952697753906f,   -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,   0.2035212516784668f,   0.2920137718319893f,    0.3893125355243683f,
    0.5016634166240692f,   0.6427869200706482f,   0.8614784181118011f};

// The 4-bit index of an absmax-scaled value: count of thresholds strictly below it (NaN -> 0).
inline std::uint8_t nf4_index(float scaled) {
  std::uint8_t q = 0;
  for (float t : kNf4Thresholds) q += scaled > t ? 1 : 0;
  return q;
}

// bitsandbytes' signed dynamic 8-bit map, create_dynamic_map(signed=True, max_exponent_bits=7,
// total_bits=8): 256 sorted fp32 values in [-1, 1], code[127] = 0, code[255] = 1. Built with
// torch.linspace's scalar fp32 arithmetic; a SIMD torch build may differ in the last bit of a few
// entries, which is harmless since the table travels with the quantised data (GPU: upload it).
const std::array<float, 256>& dynamic_map_signed();

// The 8-bit index of a scaled value exactly as bitsandbytes' dQuantize<0> selects it: a 7-step
// binary search over the sorted code, then the nearer of the two neighbours by midpoint.
std::uint8_t dynamic_map_index(float scaled);

struct Nf4Tensor {
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::vector<std::uint8_t> packed;  // [(numel + 1) / 2], even element in the high nibble
  bool double_quant = false;
  std::vector<float> absmax;           // [num_blocks] fp32; empty when double_quant
  std::vector<std::uint8_t> absmax_q;  // [num_blocks] dynamic-map indices; when double_quant
  std::vector<float> nested_absmax;    // [ceil(num_blocks / 256)]; when double_quant
  float absmax_offset = 0.0f;          // mean of the fp32 absmax; when double_quant
  // The 256-entry map the absmax codes index; empty means dynamic_map_signed(). A bitsandbytes
  // checkpoint stores its own (nested_quant_map), which may differ from ours in the last bit of
  // a few entries (model/bnb4.h), so it travels with the codes.
  std::vector<float> code8;

  std::int64_t num_blocks() const { return (numel + kNf4BlockSize - 1) / kNf4BlockSize; }
  float block_absmax(std::int64_t block) const;  // decoded (through double quantisation if on)
  std::vector<float> decoded_absmax() const;     // all of them
  std::size_t storage_bytes() const;             // packed + absmax storage (excl. the tables)
};

struct Nf4Options {
  bool double_quant = true;  // QLoRA's default (bnb_4bit_use_double_quant)
  int threads = 0;           // 0: std::thread::hardware_concurrency()
};

// Stores a tensor's per-block absmax: as is, or double-quantised (8-bit codes + nested absmax).
void store_block_absmax(Nf4Tensor& t, std::vector<float> absmax, bool double_quant);

// Quantises fp32 values (row-major) of the given shape.
Nf4Tensor nf4_quantize(std::span<const float> values, std::vector<std::int64_t> shape,
                       const Nf4Options& options = {});

// Quantises numel(shape) values that `load(first, out)` provides as fp32, a block range at a time
// (out.size() <= 64, from several threads at once): the checkpoint quantiser converts block
// ranges of a mapped file this way (model/nf4.h), so host memory stays at the packed result.
Nf4Tensor nf4_quantize(std::vector<std::int64_t> shape,
                       const std::function<void(std::int64_t first, std::span<float> out)>& load,
                       const Nf4Options& options = {});

// Double quantisation of fp32 absmax values (offset = mean, blocks of 256, dynamic map).
struct QuantizedAbsmax {
  std::vector<std::uint8_t> codes;
  std::vector<float> nested_absmax;
  float offset = 0.0f;
};
QuantizedAbsmax double_quantize_absmax(std::span<const float> absmax);

// Dequantises to fp32 (round to bf16 with io::float_to_bf16 for the compute dtype).
void nf4_dequantize(const Nf4Tensor& t, std::span<float> out);
std::vector<float> nf4_dequantize(const Nf4Tensor& t);
// Elements [first, first + out.size()) only (a merge dequantises a row segment at a time).
void nf4_dequantize(const Nf4Tensor& t, std::int64_t first, std::span<float> out);

}  // namespace forja::quant
