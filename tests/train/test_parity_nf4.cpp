// QLoRA's base path against the PyTorch reference: forja trains on NF4-quantised base weights
// (fused NF4 GEMMs, double quantisation on); the reference trains on the same weights
// dequantised on the CPU (quant::nf4_dequantize, bitsandbytes-exact) and written to a new
// checkpoint (train/parity_support.h, nf4_parity_case). In fp32, gradients of step 0 and the
// losses of 20 AdamW steps must match to 1e-4; mixed precision (test_parity_mixed.cpp) to 1e-2.
#include <gtest/gtest.h>

#include "support/gpu_fixture.h"
#include "train/parity_support.h"

namespace forja::test {
namespace {

class ParityNf4 : public GpuTest {};

TEST_F(ParityNf4, Qwen3TrainsOnNf4LikeTheReferenceOnDequantisedWeights) {
  ParityRun r;
  r.name = "qwen3-gqa-bf16";
  r.quant = model::BaseQuant::nf4;
  r.checkpointing = true;
  run_parity(ctx(), r);
}

}  // namespace
}  // namespace forja::test
