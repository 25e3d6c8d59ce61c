// NF4 block quantisation and double quantisation on the CPU, reproducing bitsandbytes' CUDA
// kernels decision for decision (see the layout comment in quant/nf4.h).
#include "quant/nf4.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include <stdexcept>

namespace forja::quant {
namespace {

// torch.linspace(start, end, steps, dtype=float32) on the CPU, scalar path: fp32 step, the first
// half counted up from start and the second half down from end.
std::vector<float> torch_linspace(float start, float end, int steps) {
  std::vector<float> out(static_cast<std::size_t>(steps));
  if (steps == 1) {
    out[0] = start;
    return out;
  }
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int halfway = steps / 2;
  for (int i = 0; i < steps; ++i)
    out[static_cast<std::size_t>(i)] = i < halfway ? start + step * static_cast<float>(i)
                                                   : end - step * static_cast<float>(steps - i - 1);
  return out;
}

std::array<float, 256> build_dynamic_map_signed() {
  constexpr int max_exponent_bits = 7, total_bits = 8;
  constexpr int non_sign_bits = total_bits - 1;
  std::vector<float> data;
  // additional_items = 2^(non_sign_bits - max_exponent_bits) - 1 = 0 for these arguments.
  for (int i = 0; i < max_exponent_bits; ++i) {
    const int fraction_items = (1 << (i + non_sign_bits - max_exponent_bits)) + 1;
    const std::vector<float> boundaries = torch_linspace(0.1f, 1.0f, fraction_items);
    // Python's 10 ** (-(max_exponent_bits - 1) + i), then cast to fp32 by the tensor multiply.
    const float scale = static_cast<float>(std::pow(10.0, -(max_exponent_bits - 1) + i));
    std::vector<float> means;
    for (std::size_t k = 0; k + 1 < boundaries.size(); ++k)
      means.push_back((boundaries[k] + boundaries[k + 1]) / 2.0f);
    for (float m : means) data.push_back(scale * m);
    for (float m : means) data.push_back(-scale * m);
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  std::array<float, 256> out{};
  if (data.size() != out.size()) throw std::logic_error("dynamic map: wrong size");
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

unsigned worker_count(const Nf4Options& options, std::int64_t blocks) {
  unsigned n = options.threads > 0 ? static_cast<unsigned>(options.threads)
                                   : std::thread::hardware_concurrency();
  n = std::max(1u, n);
  // Below ~256 blocks (16K elements) a thread costs more than it saves.
  return static_cast<unsigned>(std::min<std::int64_t>(n, std::max<std::int64_t>(1, blocks / 256)));
}

// Quantises blocks [first_block, last_block): `load(first_element, span)` provides fp32 values.
template <typename Load>
void quantize_blocks(std::int64_t numel, std::int64_t first_block, std::int64_t last_block,
                     Load&& load, std::uint8_t* packed, float* absmax) {
  float x[kNf4BlockSize];
  for (std::int64_t b = first_block; b < last_block; ++b) {
    const std::int64_t begin = b * kNf4BlockSize;
    const std::int64_t count = std::min(kNf4BlockSize, numel - begin);
    load(begin, std::span<float>(x, static_cast<std::size_t>(count)));
    float amax = 0.0f;
    for (std::int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(x[i]));
    absmax[b] = amax;
    const float inv = 1.0f / amax;  // as the kernel: multiply by the reciprocal, not divide
    for (std::int64_t i = count; i < kNf4BlockSize; ++i) x[i] = 0.0f;  // pad element of odd n
    const std::int64_t bytes = (count + 1) / 2;
    std::uint8_t* out = packed + begin / 2;
    for (std::int64_t k = 0; k < bytes; ++k) {
      const std::uint8_t hi = nf4_index(x[2 * k] * inv);
      const std::uint8_t lo = nf4_index(x[2 * k + 1] * inv);
      out[k] = static_cast<std::uint8_t>((hi << 4) | lo);
    }
  }
}

template <typename Load>
Nf4Tensor quantize_impl(std::vector<std::int64_t> shape, std::int64_t numel,
                        const Nf4Options& options, Load&& load) {
  Nf4Tensor t;
  t.shape = std::move(shape);
  t.numel = numel;
  t.packed.assign(static_cast<std::size_t>((numel + 1) / 2), 0);
  const std::int64_t blocks = t.num_blocks();
  std::vector<float> absmax(static_cast<std::size_t>(blocks));
  const unsigned workers = worker_count(options, blocks);
  if (workers <= 1) {
    quantize_blocks(numel, 0, blocks, load, t.packed.data(), absmax.data());
  } else {
    std::vector<std::thread> pool;
    const std::int64_t per = (blocks + workers - 1) / workers;
    for (unsigned w = 0; w < workers; ++w) {
      const std::int64_t first = w * per, last = std::min(blocks, first + per);
      if (first >= last) break;
      pool.emplace_back([&, first, last] {
        quantize_blocks(numel, first, last, load, t.packed.data(), absmax.data());
      });
    }
    for (auto& th : pool) th.join();
  }
  store_block_absmax(t, std::move(absmax), options.double_quant);
  return t;
}

std::int64_t checked_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("nf4_quantize: negative dimension");
    n *= d;
  }
  return n;
}

}  // namespace

const std::array<float, 256>& dynamic_map_signed() {
  static const std::array<float, 256> map = build_dynamic_map_signed();
  return map;
}

std::uint8_t dynamic_map_index(float x) {
  // bitsandbytes csrc/kernels.cu dQuantize<STOCHASTIC=0>, step for step.
  const std::array<float, 256>& code = dynamic_map_signed();
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[static_cast<std::size_t>(pivot)];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[static_cast<std::size_t>(pivot)];
  }
  if (upper_pivot == 255) upper = code[255];
  if (lower_pivot == 0) lower = code[0];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return static_cast<std::uint8_t>(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return static_cast<std::uint8_t>(x < midpoint ? lower_pivot : pivot);
}

QuantizedAbsmax double_quantize_absmax(std::span<const float> absmax) {
  QuantizedAbsmax q;
  if (absmax.empty()) return q;
  // offset = absmax.mean(): accumulated in double and rounded once (torch's fp32 cascade sum can
  // differ in the last bit; the offset is stored, so dequantisation is unaffected).
  double sum = 0.0;
  for (float a : absmax) sum += a;
  q.offset = static_cast<float>(sum / static_cast<double>(absmax.size()));
  const std::size_t n = absmax.size();
  const std::size_t blocks = (n + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize;
  q.codes.resize(n);
  q.nested_absmax.resize(blocks);
  float centred[kNf4NestedBlockSize];
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t begin = b * kNf4NestedBlockSize;
    const std::size_t count = std::min<std::size_t>(kNf4NestedBlockSize, n - begin);
    float amax = 0.0f;
    for (std::size_t i = 0; i < count; ++i) {
      centred[i] = absmax[begin + i] - q.offset;
      amax = std::max(amax, std::fabs(centred[i]));
    }
    q.nested_absmax[b] = amax;
    const float inv = 1.0f / amax;
    for (std::size_t i = 0; i < count; ++i)
      q.codes[begin + i] = dynamic_map_index(centred[i] * inv);
  }
  return q;
}

float Nf4Tensor::block_absmax(std::int64_t block) const {
  const std::size_t b = static_cast<std::size_t>(block);
  if (!double_quant) return absmax[b];
  const float code = code8.empty() ? dynamic_map_signed()[absmax_q[b]] : code8[absmax_q[b]];
  return code * nested_absmax[b / kNf4NestedBlockSize] + absmax_offset;
}

std::vector<float> Nf4Tensor::decoded_absmax() const {
  std::vector<float> out(static_cast<std::size_t>(num_blocks()));
  for (std::int64_t b = 0; b < num_blocks(); ++b)
    out[static_cast<std::size_t>(b)] = block_absmax(b);
  return out;
}

std::size_t Nf4Tensor::storage_bytes() const {
  return packed.size() + absmax.size() * 4 + absmax_q.size() + nested_absmax.size() * 4 +
         (double_quant ? 4 : 0);
}

Nf4Tensor nf4_quantize(std::span<const float> values, std::vector<std::int64_t> shape,
                       const Nf4Options& options) {
  const std::int64_t numel = checked_numel(shape);
  if (static_cast<std::int64_t>(values.size()) != numel)
    throw std::invalid_argument("nf4_quantize: values do not match the shape");
  return quantize_impl(std::move(shape), numel, options,
                       [&](std::int64_t first, std::span<float> out) {
                         std::copy_n(values.begin() + first, out.size(), out.begin());
                       });
}

Nf4Tensor nf4_quantize(std::vector<std::int64_t> shape,
                       const std::function<void(std::int64_t first, std::span<float> out)>& load,
                       const Nf4Options& options) {
  const std::int64_t numel = checked_numel(shape);
  return quantize_impl(std::move(shape), numel, options, load);
}

void nf4_dequantize(const Nf4Tensor& t, std::span<float> out) {
  if (static_cast<std::int64_t>(out.size()) != t.numel)
    throw std::invalid_argument("nf4_dequantize: output size does not match the tensor");
  nf4_dequantize(t, 0, out);
}

void nf4_dequantize(const Nf4Tensor& t, std::int64_t first, std::span<float> out) {
  const std::int64_t last = first + static_cast<std::int64_t>(out.size());
  if (first < 0 || last > t.numel)
    throw std::invalid_argument("nf4_dequantize: range past the end of the tensor");
  for (std::int64_t b = first / kNf4BlockSize; b * kNf4BlockSize < last; ++b) {
    const float a = t.block_absmax(b);
    const std::int64_t begin = std::max(first, b * kNf4BlockSize);
    const std::int64_t end = std::min(last, (b + 1) * kNf4BlockSize);
    for (std::int64_t e = begin; e < end; ++e) {
      const std::uint8_t byte = t.packed[static_cast<std::size_t>(e / 2)];
      const std::uint8_t q = (e % 2 == 0) ? (byte >> 4) : (byte & 0x0f);
      out[static_cast<std::size_t>(e - first)] = kNf4Code[q] * a;
    }
  }
}

std::vector<float> nf4_dequantize(const Nf4Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel));
  nf4_dequantize(t, out);
  return out;
}

void store_block_absmax(Nf4Tensor& t, std::vector<float> absmax, bool double_quant) {
  if (double_quant) {
    QuantizedAbsmax q = double_quantize_absmax(absmax);
    t.double_quant = true;
    t.absmax_q = std::move(q.codes);
    t.nested_absmax = std::move(q.nested_absmax);
    t.absmax_offset = q.offset;
  } else {
    t.absmax = std::move(absmax);
  }
}

}  // namespace forja::quant
