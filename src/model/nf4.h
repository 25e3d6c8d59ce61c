// NF4 for checkpoints: a mapped safetensors tensor quantised block range by block range, and
// every projection weight of a checkpoint streamed through NF4 (the codec itself, its packed
// layout and its arithmetic are quant/nf4.h).
#pragma once
#include <functional>
#include <string>

#include "io/safetensors.h"
#include "model/config.h"
#include "quant/nf4.h"

namespace forja::model {

// Quantises a tensor straight from a mapped checkpoint (F32/F16/BF16), converting block ranges
// to fp32 inside the worker threads: host memory stays at the packed result plus a few KB per
// thread.
quant::Nf4Tensor nf4_quantize_tensor(const io::TensorView& tensor, const quant::Nf4Options& options = {});

// Streams every projection weight of a checkpoint through NF4, one tensor at a time, in layer
// order: checks each weight's shape against the config (UserError naming the tensor, the shapes
// and the fix), quantises it, releases its source pages (io::SafetensorsFile::release) and hands
// it to `sink`, which may upload and drop it. Peak host memory beyond the mapped files is one
// quantised tensor. Measured on a Qwen3-4B-shaped bf16 checkpoint (8.0 GB, 2 shards, 252
// linears -> 1.874 GB NF4+DQ, 2 threads on a shared 2-core machine, 56 s): peak anonymous memory
// 18.7 MB, peak resident set including mapped file pages 71 MB.
void quantize_checkpoint_linears(
    const io::SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
    const quant::Nf4Options& options,
    const std::function<void(const std::string& name, quant::Nf4Tensor&& tensor)>& sink);

}  // namespace forja::model
