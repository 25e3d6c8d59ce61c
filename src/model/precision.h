// The training engine's arithmetic (--precision):
//   fp32   the reference: fp32 activations, weights and arithmetic everywhere (scalar kernels),
//          matching the PyTorch reference to 1e-4 on any device.
//   mixed  the products with the frozen base (projections, LM head) take fp16 operands with fp32
//          accumulation: fp16 dense weights, embedding and LM head, activations rounded to fp16
//          as the GEMM loads them (cooperative-matrix kernels where the device has them, fp16
//          scalar kernels elsewhere). The residual stream, norms, attention, softmax
//          statistics, the loss, LoRA parameters and products, and optimizer state stay fp32.
//   auto   (the default) mixed where the device has matrix cores that forja's GEMM uses (NV
//          cooperative matrix 2, KHR or NV cooperative matrix), else fp32: on a device without
//          them fp16 buys no speed. Resolved once the device is open; the run records the result.
// bf16 (bf16 operands, no loss scaling) waits for a glslang with GL_EXT_bfloat16 (16.x), which
// Debian's mirror does not serve yet (scripts/shader_tools).
#pragma once
#include <optional>
#include <string>

#include "ops/gemm.h"

namespace forja::model {

enum class Precision { fp32, mixed };

// --precision as given: a precision, or std::nullopt for auto (resolved once the device is open).
using PrecisionChoice = std::optional<Precision>;

// "fp32" | "mixed"; anything else ("auto" included: resolve it first) is a UserError naming
// --precision.
Precision parse_precision(const std::string& text);
// "auto" -> std::nullopt, else as parse_precision.
PrecisionChoice parse_precision_choice(const std::string& text);
// auto resolved for this device (see above); a precision stays as it is.
Precision resolve_precision(PrecisionChoice choice, const gpu::Context& ctx);
Precision resolve_precision(const std::string& text, const gpu::Context& ctx);
// One line for the run's log: what `choice` became on this device, and why.
std::string describe_precision_choice(PrecisionChoice choice, const gpu::Context& ctx);
std::string describe_precision_choice(const std::string& text, const gpu::Context& ctx);
const char* precision_name(Precision p);
// The dtype of dense base weights (--quant none projections, embedding, LM head) under `p`.
inline ops::DType dense_dtype_for(Precision p) { return p == Precision::mixed ? ops::DType::f16 : ops::DType::f32; }

}  // namespace forja::model
