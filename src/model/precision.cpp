#include "model/precision.h"

#include "util/error.h"

namespace forja::model {

Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::fp32;
  if (text == "mixed") return Precision::mixed;
  throw UserError("--precision " + text + ": expected fp32 or mixed");
}

PrecisionChoice parse_precision_choice(const std::string& text) {
  if (text == "auto") return std::nullopt;
  return parse_precision(text);
}

Precision resolve_precision(PrecisionChoice choice, const gpu::Context& ctx) {
  if (choice) return *choice;
  return ops::gemm_kernel_for(ctx, ops::DType::f16) == ops::GemmKernel::scalar ? Precision::fp32 : Precision::mixed;
}

Precision resolve_precision(const std::string& text, const gpu::Context& ctx) {
  return resolve_precision(parse_precision_choice(text), ctx);
}

std::string describe_precision_choice(PrecisionChoice choice, const gpu::Context& ctx) {
  const Precision p = resolve_precision(choice, ctx);
  std::string line = std::string("precision: ") + precision_name(p);
  if (!choice) {
    const ops::GemmKernel k = ops::gemm_kernel_for(ctx, ops::DType::f16);
    line += k == ops::GemmKernel::scalar
                ? " (auto: no matrix cores that forja uses on " + ctx.info().name + ")"
                : " (auto: fp16 products on matrix cores, " + ops::gemm_kernel_name(k) + " kernels)";
  }
  return line;
}

std::string describe_precision_choice(const std::string& text, const gpu::Context& ctx) {
  return describe_precision_choice(parse_precision_choice(text), ctx);
}

const char* precision_name(Precision p) { return p == Precision::mixed ? "mixed" : "fp32"; }

}  // namespace forja::model
