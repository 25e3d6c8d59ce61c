// The training engine's arithmetic (--precision):
//   fp32   the reference: fp32 activations, weights and arithmetic everywhere (scalar kernels),
//          matching the PyTorch reference to 1e-4 on any device.
//   mixed  the products with the frozen base (projections, LM head) take fp16 operands with fp32
//          accumulation: fp16 dense weights, embedding and LM head, activations rounded to fp16
//          as the GEMM loads them (cooperative-matrix kernels where the device has them, fp16
//          scalar kernels elsewhere). The residual stream, norms, attention, softmax
//          statistics, the loss, LoRA parameters and products, and optimizer state stay fp32.
#pragma once
#include <string>

#include "ops/gemm.h"

namespace forja::model {

enum class Precision { fp32, mixed };

// "fp32" | "mixed"; anything else is a UserError naming --precision.
Precision parse_precision(const std::string& text);
const char* precision_name(Precision p);
// The dtype of dense base weights (--quant none projections, embedding, LM head) under `p`.
inline ops::DType dense_dtype_for(Precision p) { return p == Precision::mixed ? ops::DType::f16 : ops::DType::f32; }

}  // namespace forja::model
