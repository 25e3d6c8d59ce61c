// A model of a named shape with random weights, built on the GPU without any file, for
// `forja bench` (an 8B checkpoint would be 16 GB to write and read; speed does not depend on the
// values). Everything is deterministic from a seed and streamed tensor by tensor, so host memory
// stays at one upload piece or one quantised projection.
//
// Values follow Hugging Face's initialisation so the loss is finite and ordinary: embedding, LM
// head and projection weights ~ normal(0, 0.02), RMSNorm weights 1, biases 0. NF4 projection
// weights are made directly in the packed format instead of quantising normal values (which
// costs minutes on the CPU for a 4B/8B model): uniformly random 4-bit codes (the NF4 levels are
// quantiles of the normal distribution, so every code is about equally likely for normal data)
// and per-block absmax values around 0.02 * 2.5 (the expected largest |x| of 64 normal(0, 0.02)
// draws), double-quantised exactly as bitsandbytes does when the options ask for it.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/context.h"
#include "model/base_weights.h"
#include "model/config.h"
#include "quant/nf4.h"
#include "model/transformer.h"

namespace forja::model {

// The shapes `forja bench --shape` knows: "tiny" (a small Qwen3 that runs in seconds on a CPU
// driver), "qwen3-0.6b", "qwen3-4b", "qwen3-8b".
const std::vector<std::string>& bench_shape_names();
// The config of a named shape (Qwen3: vocab 151936, RoPE theta 1e6, RMSNorm eps 1e-6, head_dim
// 128, q/k norm). UserError listing the valid names for an unknown one.
ModelConfig bench_shape_config(std::string_view name);

// Base weights of `config` with random values (see above) from `seed`.
BaseWeights random_base_weights(gpu::Context& ctx, const ModelConfig& config, const BaseWeightOptions& options,
                                uint64_t seed);

// Elements [first, first + out.size()) of the normal(0, stddev) stream named by `seed`: the same
// element always gets the same value whatever range it is read in.
void random_normal(uint64_t seed, int64_t first, std::span<float> out, float stddev);

// A valid NF4 tensor of `shape` with random codes and absmax values around 0.05 (see above).
quant::Nf4Tensor random_nf4_tensor(const std::vector<int64_t>& shape, uint64_t seed, bool double_quant);

// One micro-batch of `batch` rows of `seq` random token ids in [0, vocab); targets are the ids
// shifted by one (the last position of each row has none), positions 0..seq-1, one document
// per row (segment 1).
TokenBatch random_token_batch(uint32_t batch, uint32_t seq, int64_t vocab, uint64_t seed);

}  // namespace forja::model
