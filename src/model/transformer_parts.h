// What the training engine's two source files share (model/transformer.cpp: the engine, its
// layers and runs; model/transformer_linear.cpp: its projections with their LoRA factors).
#pragma once
#include "model/config.h"
#include "model/transformer.h"
#include "ops/gemm.h"

namespace forja::model {

// Activation gradients, shared by all layers.
struct Transformer::GradScratch {
  gpu::Buffer dx;              // [T, H] gradient of the residual stream
  gpu::Buffer dh;              // [T, H] gradient of a norm's output
  gpu::Buffer datt;            // [T, nh*d]
  gpu::Buffer dq, dk, dv;      // after attention's backward
  gpu::Buffer dq_raw, dk_raw;  // before the q/k norm
  gpu::Buffer dg, du, dact;    // [T, I]
  gpu::Buffer dt;              // LoRA dt of every target, [T, targets * r] (lora_view)
};

namespace parts {

// A LoRA product, filed under its own name in the GPU profile (FORJA_PROFILE=1): lora_xa (t = x
// A^T), lora_tb (y += s t B^T), lora_db (dB), lora_dt (dt = s dy B), lora_da (dA), lora_dx (dx +=
// dt A).
inline ops::GemmShape lora_product(ops::GemmShape s, const char* op) {
  s.op = op;
  return s;
}

// The projections that read one input, in projection order.
inline constexpr LinearKind kAttentionInputReaders[] = {LinearKind::Q, LinearKind::K, LinearKind::V};
inline constexpr LinearKind kMlpInputReaders[] = {LinearKind::Gate, LinearKind::Up};
inline constexpr LinearKind kDown[] = {LinearKind::Down};
inline constexpr LinearKind kQk[] = {LinearKind::Q, LinearKind::K};

}  // namespace parts
}  // namespace forja::model
