// Token embedding gather (formats.md 1.3 step 1; kernels/embedding.comp): out[t, :] =
// table[ids[t], :] as fp32, no sqrt(hidden) scaling. The embedding is frozen, so there is no
// backward.
#pragma once
#include <cstdint>

#include "gpu/context.h"
#include "ops/gemm.h"

namespace forja::ops {

// table [vocab, hidden] in dtype (f32 or f16); ids int32 [tokens]; out fp32 [tokens, hidden].
// A table larger than the device's binding limit (Qwen3: 151936 x 2560 fp16 = 778 MB against
// 128 MiB on lavapipe) is bound in row chunks, one dispatch per chunk, each writing the tokens
// whose id falls in it; out is split in token chunks the same way when it is that large.
// Ids outside [0, vocab) read nothing and give a zero row: the kernel stays in bounds, and the
// data pipeline reports bad ids on the host.
void embedding_forward(gpu::Context& ctx, const gpu::Buffer& table, DType dtype, const gpu::Buffer& ids,
                       const gpu::Buffer& out, uint32_t tokens, uint32_t hidden, uint32_t vocab);

}  // namespace forja::ops
