// Linear layer with a LoRA adapter (formats.md 4.1, PEFT Linear.forward): double reference.
//
//   xa = (x * dropmask) A^T                  [tokens, rank]
//   y  = x W^T (+ bias) + scaling * xa B^T   [tokens, out]
//
// x [tokens, in]; w [out, in] (the frozen base weight, stored as nn.Linear keeps it);
// bias [out] or nullptr (Qwen2's q/k/v); lora_a [rank, in]; lora_b [out, rank];
// dropmask [tokens, in] or nullptr: the multiplier nn.Dropout applied, i.e. 0 for a dropped
// element and 1/(1-p) for a kept one (nullptr = no dropout). The base path sees x undropped.
// scaling = alpha / rank (or alpha / sqrt(rank) with rsLoRA).
#pragma once
#include <cstdint>

namespace forja::ref {

// y [tokens, out]; xa [tokens, rank] may be nullptr (it is the intermediate a kernel may save).
void lora_forward(double* y, double* xa, const double* x, const double* w, const double* bias,
                  const double* lora_a, const double* lora_b, const double* dropmask,
                  double scaling, int64_t tokens, int64_t in, int64_t out, int64_t rank);

// Backward (the base weight and bias are frozen and get no gradient):
//   dxa      = scaling * dy B                   [tokens, rank]
//   dx       = dy W + (dxa A) * dropmask        written with =       [tokens, in]
//   dlora_a += dxa^T (x * dropmask)             parameter: accumulates [rank, in]
//   dlora_b += scaling * dy^T xa                parameter: accumulates [out, rank]
// dx may be nullptr (first layer needs no input gradient); xa is recomputed here.
void lora_backward(double* dx, double* dlora_a, double* dlora_b, const double* dy, const double* x,
                   const double* w, const double* lora_a, const double* lora_b,
                   const double* dropmask, double scaling, int64_t tokens, int64_t in, int64_t out,
                   int64_t rank);

// PEFT merge for export: w_merged [out, in] = w + scaling * B A.
void lora_merge(double* w_merged, const double* w, const double* lora_a, const double* lora_b,
                double scaling, int64_t in, int64_t out, int64_t rank);

}  // namespace forja::ref
