// The training engine's projections (model/transformer.h): each base product with its LoRA
// factors, forward and backward. The NF4 weights are dequantised into one fp16 slot per kind
// (DequantSlot), the inputs rounded into fp16 copies, and in mixed precision the LoRA factors
// folded into the base products along K ([x | t] [W | s B]^T, [dy | dt] [W ; A]); elsewhere the
// LoRA products run beside them. The engine itself (construction, layers, runs) is
// model/transformer.cpp.
#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>

#include "model/transformer.h"
#include "model/transformer_parts.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/nf4.h"

namespace forja::model {

using ops::DType;
using ops::GemmShape;
using ops::MatrixView;
using namespace parts;

MatrixView Transformer::base_fp16(size_t layer, LinearKind kind, const BaseLinear& lin) {
  if (!lin.nf4) return MatrixView{lin.dense, lin.dense_dtype, 0, lin.in};
  return dequantised(layer, kind, lin, FoldSide::none);
}

MatrixView Transformer::dequantised(size_t layer, LinearKind kind, const BaseLinear& lin, FoldSide fold,
                                    const LoraSlot* s) {
  DequantSlot& slot = dequant_slots_[static_cast<int>(kind)];
  const uint32_t P = lora_pad_, ld = dequantised_ld(lin.in, P);
  const int64_t l = static_cast<int64_t>(layer);
  const bool have_w = slot.layer == l;
  // Each slot is reused by its kind's products in every layer; the context orders these writes
  // after the previous product's reads (the bindings' access flags).
  if (fold == FoldSide::forward) {
    // [W | scale B]: W and scale B beside it in one dispatch, or scale B alone; scale B at the
    // kind's fold column, zeros in the rest of the fold's columns
    const uint32_t lead = fold_column_[static_cast<int>(kind)];
    if (!have_w) {
      const ops::Nf4Beside scaled_b{lora_.params(), s->b_offset, s->rank, lin.in,       lin.out,
                                    P,              lin.out,     s->rank, lora_.scale(), lead};
      ops::nf4_dequantize(ctx_, *lin.nf4, slot.buffer, DType::f16, ld, &scaled_b);
    } else if (slot.scaled_b_layer != l || slot.scaled_b_run != run_count_) {
      ops::to_f16_block(ctx_, lora_.params(), s->b_offset, s->rank, slot.buffer, lin.in, ld, lin.out, s->rank, P,
                        lora_.scale(), nullptr, lead);
    }
    slot.scaled_b_layer = l, slot.scaled_b_run = run_count_;
  } else if (fold == FoldSide::backward) {
    // [W ; A]: A's rows below W, and zero rows up to P (those the initial fill left and only
    // the dequantisation's block rewrites, with zeros)
    const uint64_t below = uint64_t(lin.out) * ld;
    if (!have_w) {
      const ops::Nf4Beside a_rows{lora_.params(), s->a_offset, lin.in, below, P, lin.in, s->rank, lin.in, 1.0f};
      ops::nf4_dequantize(ctx_, *lin.nf4, slot.buffer, DType::f16, ld, &a_rows);
    } else if (slot.a_rows_layer != l || slot.a_rows_run != run_count_) {
      ops::to_f16_block(ctx_, lora_.params(), s->a_offset, lin.in, slot.buffer, below, ld, s->rank, lin.in, lin.in);
    }
    slot.a_rows_layer = l, slot.a_rows_run = run_count_;
  } else if (!have_w) {
    ops::nf4_dequantize(ctx_, *lin.nf4, slot.buffer, DType::f16, ld);
  }
  if (!have_w && fold != FoldSide::backward) slot.a_rows_layer = -1;  // a new W; A's rows are not its layer's
  slot.layer = l;
  return MatrixView{slot.buffer, DType::f16, 0, ld};
}

void Transformer::prefetch_weight(size_t layer, LinearKind kind, bool backward) {
  // FORJA_DEQUANT_PREFETCH=0: each dequantisation at its product, for measuring the difference
  static const bool on = gpu::env_flag_default_on("FORJA_DEQUANT_PREFETCH");
  const BaseLinear& lin = base_.layers[layer].linears[static_cast<int>(kind)];
  if (!on || !lin.nf4 || !nf4_scratch_.valid()) return;  // the fused NF4 products or dense weights: no slot
  const LoraSlot* slot = lora_.find(static_cast<int64_t>(layer), kind);
  if (backward ? lora_folds_backward(lin, slot) : lora_folds(lin, slot))
    dequantised(layer, kind, lin, backward ? FoldSide::backward : FoldSide::forward, slot);
  else
    base_fp16(layer, kind, lin);
}

int Transformer::range_site(size_t layer, LinearKind kind) {
  using K = LinearKind;
  const int input = kind == K::O ? 1 : kind == K::Gate || kind == K::Up ? 2 : kind == K::Down ? 3 : 0;
  return static_cast<int>(layer) * 4 + input;
}

void Transformer::reset_fp16_range_check() {
  if (range_flags_.valid()) ctx_.fill(range_flags_, 0);
}

std::string Transformer::fp16_range_report() {
  if (!range_flags_.valid()) return "";
  const std::vector<uint32_t> flags = ctx_.download<uint32_t>(range_flags_, range_flags_.size / 4);
  static const char* const inputs[] = {"attention input (the q, k, v projections' input)",
                                       "attention output (o_proj's input)", "MLP input (gate_proj and up_proj's input)",
                                       "MLP activation (down_proj's input)"};
  for (size_t i = 0; i < flags.size(); ++i)
    if (flags[i])
      return "layer " + std::to_string(i / 4) + "'s " + inputs[i % 4] +
             " holds values beyond fp16's range (65504), which --precision mixed rounds to infinity";
  return "";
}

MatrixView Transformer::base_input(const gpu::Buffer& x, uint32_t cols, bool ready, uint32_t extra, int range_site) {
  if (!input16_.valid()) return MatrixView{x, DType::f32, 0, cols};
  const uint32_t ld = cols + extra;
  const bool same = x.buffer == input16_source_.buffer && x.offset == input16_source_.offset &&
                    cols == input16_cols_ && ld == input16_ld_;
  if (ready && same) return MatrixView{input16_, DType::f16, 0, ld};
  input16_source_ = x;
  input16_cols_ = cols;
  input16_ld_ = ld;
  // Like nf4_scratch_, reused by every product; the context orders the writes after earlier reads.
  const ops::Fp16RangeFlag flag{range_flags_, static_cast<uint32_t>(std::max(range_site, 0))};
  const ops::Fp16RangeFlag* check = range_site >= 0 && range_flags_.valid() ? &flag : nullptr;
  if (extra == 0)
    ops::to_f16(ctx_, x, input16_, uint64_t(tokens_) * cols, check);
  else
    ops::to_f16_block(ctx_, x, 0, cols, input16_, 0, ld, tokens_, cols, cols, 1.0f, check);
  return MatrixView{input16_, DType::f16, 0, ld};
}

bool Transformer::lora_folds_backward(const BaseLinear& lin, const LoraSlot* s) const {
  return !dropout_on_ && lora_folds(lin, s);  // with dropout dx gets mask * (dt A), which cannot join dy W
}

bool Transformer::lora_folds(const BaseLinear& lin, const LoraSlot* s) const {
  return s && lora_pad_ > 0 && lin.nf4 && nf4_scratch_.valid() && input16_.valid() && lin.in % 8 == 0 &&
         lin.out % 8 == 0;
}

MatrixView Transformer::lora_view(const gpu::Buffer& b, LinearKind kind, uint64_t row0) const {
  return MatrixView{b, DType::f32, row0 * lora_width_ + lora_column_[static_cast<int>(kind)], lora_width_};
}

MatrixView Transformer::lora_weight(uint64_t offset, uint32_t ld) const {
  if (lora_f16_) return MatrixView{lora16_, DType::f16, offset, ld};
  return MatrixView{lora_.params(), DType::f32, offset, ld};
}

MatrixView Transformer::lora_t_operand(const gpu::Buffer& lora_t, LinearKind kind) const {
  if (lora_f16_) return MatrixView{t16_, DType::f16, lora_column_[static_cast<int>(kind)], lora_width_};
  return lora_view(lora_t, kind);
}

MatrixView Transformer::lora_input_operand(const gpu::Buffer& x, uint32_t cols) {
  if (lora_f16_) return base_input(x, cols);  // x itself where there are no fp16 input copies
  return MatrixView{x, DType::f32, 0, cols};
}

ops::GemmKernel Transformer::lora_kernel(const MatrixView& b) const {
  return b.dtype == DType::f16 ? options_.base_kernel : ops::GemmKernel::automatic;
}

uint32_t Transformer::lora_group(size_t layer, std::initializer_list<LinearKind> kinds) const {
  if (dropout_on_) return 0;  // each projection draws its own dropout mask on the shared input
  const uint32_t n = lora_.shared_input_run(static_cast<int64_t>(layer), kinds);
  if (n < 2) return 0;
  // lora_group_backward's dx product serves a group whose members all fold, or none does.
  const auto folds = [&](LinearKind k) {
    return lora_folds(base_.layers[layer].linears[static_cast<int>(k)], lora_.find(static_cast<int64_t>(layer), k));
  };
  const bool first = folds(*kinds.begin());
  uint32_t i = 0;
  for (LinearKind k : kinds)
    if (i++ < n && folds(k) != first) return 0;
  return n;
}

bool Transformer::lora_group_forward(size_t layer, LinearKind first, uint32_t n, const gpu::Buffer& x,
                                     const gpu::Buffer& lora_t, bool x_f16) {
  const LoraSlot& s = *lora_.find(static_cast<int64_t>(layer), first);
  const uint32_t T = tokens_, rows = n * s.rank;
  // [t_1 .. t_n] = x [A_1; ..; A_n]^T: one pass over x for n adapters. Folded projections
  // (lora_group keeps a group all folded or none) read x's fp16 copy, which linear_forward then
  // reuses (same x, same row length).
  const bool folded = lora_folds(base_.layers[layer].linears[static_cast<int>(first)], &s);
  const MatrixView a = lora_weight(s.a_offset, s.in);
  const MatrixView in = x_f16    ? f16_copy(x, s.in)
                        : folded ? base_input(x, s.in, false, lora_pad_, range_site(layer, first))
                                 : MatrixView{x, DType::f32, 0, s.in};
  ops::gemm(ctx_, lora_product({T, rows, s.in, false, true}, "lora_xa"), in, a, lora_view(lora_t, first),
            lora_kernel(a));
  return folded;
}

void Transformer::lora_group_backward(size_t layer, LinearKind first, uint32_t n, const gpu::Buffer& x,
                                      const gpu::Buffer& dx, bool x_f16) {
  const LoraSlot& s = *lora_.find(static_cast<int64_t>(layer), first);
  const uint32_t T = tokens_, rows = n * s.rank;
  const MatrixView dt = lora_view(grad_->dt, first);
  // [dA_1; ..; dA_n] += [dt_1 .. dt_n]^T x;  dx += [dt_1 .. dt_n] [A_1; ..; A_n]
  const MatrixView xb = x_f16 ? f16_copy(x, s.in) : lora_input_operand(x, s.in);
  if (lora_folds(base_.layers[layer].linears[static_cast<int>(first)], &s)) {
    // Folded projections (lora_group keeps a group all folded or none) took dt A into dy W and
    // left dt's fp16 copy in dt16_.
    ops::gemm(ctx_, lora_product({rows, s.in, T, true, false, lora_grad_scale_, 1.0f}, "lora_da"),
              MatrixView{dt16_, DType::f16, lora_column_[static_cast<int>(first)], lora_width_}, xb,
              MatrixView{lora_.grads(), DType::f32, s.a_offset, s.in}, options_.base_kernel);
    return;
  }
  ops::gemm(ctx_, lora_product({rows, s.in, T, true, false, lora_grad_scale_, 1.0f}, "lora_da"), dt, xb,
            MatrixView{lora_.grads(), DType::f32, s.a_offset, s.in}, lora_kernel(xb));
  ops::gemm(ctx_, lora_product({T, s.in, rows, false, false, 1.0f, 1.0f}, "lora_dx"), dt,
            MatrixView{lora_.params(), DType::f32, s.a_offset, s.in}, MatrixView{dx, DType::f32, 0, s.in});
}

void Transformer::linear_forward(size_t layer, LinearKind kind, const gpu::Buffer& x, const gpu::Buffer& y,
                                 const gpu::Buffer& lora_t, bool accumulate, bool lora_t_ready, bool input16_ready,
                                 bool x_f16, uint32_t pad_t) {
  const BaseLinear& lin = base_.layers[layer].linears[static_cast<int>(kind)];
  const uint32_t T = tokens_;
  const float beta = accumulate ? 1.0f : 0.0f;
  const LoraSlot* slot = lora_.find(static_cast<int64_t>(layer), kind);
  if (lora_folds(lin, slot)) {
    // y (=|+=) [x | t] [W | scale B]^T: the LoRA update inside the base product, K = in + P
    // (t and scale B rounded to fp16, zero columns up to P), instead of a second pass over y.
    const uint32_t P = lora_pad_, K = lin.in + P, r = slot->rank;
    const MatrixView xin =
        x_f16 ? f16_copy(x, lin.in) : base_input(x, lin.in, input16_ready, P, range_site(layer, kind));
    // t = x A^T from x's fp16 copy (dropout: dropout(x) A^T), unless lora_group_forward made it
    if (!lora_t_ready && dropout_on_) lora_input_forward(layer, *slot, x, lora_t);
    if (!lora_t_ready && !dropout_on_)
      ops::gemm(ctx_, lora_product({T, r, lin.in, false, true}, "lora_xa"), xin, lora_weight(slot->a_offset, lin.in),
                lora_view(lora_t, kind), options_.base_kernel);
    // t (and a group's later members' t, side by side) into the fold columns beside x, zeros
    // elsewhere; each slot holds zeros where the others' scale B would be
    if (pad_t > 0)
      ops::to_f16_block(ctx_, lora_t, lora_column_[static_cast<int>(kind)], lora_width_, xin.buffer, lin.in, K, T,
                        pad_t * r, P, 1.0f, nullptr, fold_column_[static_cast<int>(kind)]);
    ops::gemm(ctx_, GemmShape{T, lin.out, K, false, true, 1.0f, beta}, xin,
              dequantised(layer, kind, lin, FoldSide::forward, slot), MatrixView{y, DType::f32, 0, lin.out},
              options_.base_kernel);
    if (lin.bias.valid()) ops::add_row_bias(ctx_, lin.bias, y, T, lin.out);
    return;
  }
  // An fp16 x without LoRA: the product reads it as it is (the kept attention output)
  if (x_f16 && (slot || !input16_.valid() || (lin.nf4 && !nf4_scratch_.valid())))
    throw std::logic_error("linear_forward: an fp16 x needs the folded LoRA path, or no LoRA and dequantised weights");
  // t = x A^T (or dropout(x) A^T)  [T, r], unless lora_group_forward made it
  if (slot && !lora_t_ready) lora_input_forward(layer, *slot, x, lora_t);
  if (lin.nf4 && !nf4_scratch_.valid()) {
    ops::nf4_gemm_xwt(ctx_, x, *lin.nf4, y, T, 1.0f, beta, base_operands_, options_.base_kernel);
  } else {  // mixed: fp16 W, x rounded to fp16 as it is loaded
    ops::gemm(ctx_, GemmShape{T, lin.out, lin.in, false, true, 1.0f, beta},
              x_f16 ? f16_copy(x, lin.in) : base_input(x, lin.in, input16_ready, 0, range_site(layer, kind)),
              base_fp16(layer, kind, lin), MatrixView{y, DType::f32, 0, lin.out}, options_.base_kernel);
  }
  if (lin.bias.valid()) ops::add_row_bias(ctx_, lin.bias, y, T, lin.out);
  if (slot) {
    // y += scale * t B^T, with fp32 B: a pass over y that reads and writes it, whose fp32 scalar
    // kernel outran the matrix-core one (K = r) on an H100 (docs/benchmarks.md)
    const uint32_t r = slot->rank;
    ops::gemm(ctx_, lora_product({T, slot->out, r, false, true, lora_.scale(), 1.0f}, "lora_tb"), lora_view(lora_t, kind),
              MatrixView{lora_.params(), DType::f32, slot->b_offset, r}, MatrixView{y, DType::f32, 0, slot->out});
  }
}

void Transformer::linear_backward(size_t layer, LinearKind kind, const gpu::Buffer& x, const gpu::Buffer& lora_t,
                                  const gpu::Buffer& dy, const gpu::Buffer& dx, bool accumulate_dx, bool grouped,
                                  bool dy_f16, bool x_f16) {
  const BaseLinear& lin = base_.layers[layer].linears[static_cast<int>(kind)];
  const uint32_t T = tokens_;
  const float beta = accumulate_dx ? 1.0f : 0.0f;
  const LoraSlot* s = lora_.find(static_cast<int64_t>(layer), kind);
  if (lora_folds_backward(lin, s)) return linear_backward_folded(lin, *s, x, dy, dx, beta, grouped, dy_f16, x_f16);
  if (dy_f16 || (x_f16 && s)) throw std::logic_error("linear_backward: an fp16 dy or x needs the folded LoRA path");
  // dx (=|+=) dy W
  if (lin.nf4 && !nf4_scratch_.valid()) {
    ops::nf4_gemm_dyw(ctx_, dy, *lin.nf4, dx, T, 1.0f, beta, base_operands_, options_.base_kernel);
  } else {
    ops::gemm(ctx_, GemmShape{T, lin.in, lin.out, false, false, 1.0f, beta}, base_input(dy, lin.out),
              base_fp16(layer, kind, lin),
              MatrixView{dx, DType::f32, 0, lin.in}, options_.base_kernel);
  }
  if (!s) return;
  const uint32_t r = s->rank;
  const float scale = lora_.scale();
  const MatrixView dt = lora_view(grad_->dt, kind);
  // dB += scale * dy^T t          [out, r]   (lora_grad_scale_: see run)
  const MatrixView t = lora_t_operand(lora_t, kind), b = lora_weight(s->b_offset, r);
  ops::gemm(ctx_, lora_product({s->out, r, T, true, false, scale * lora_grad_scale_, 1.0f}, "lora_db"),
            MatrixView{dy, DType::f32, 0, s->out}, t, MatrixView{lora_.grad_b(*s), DType::f32, 0, r}, lora_kernel(t));
  // dt = scale * dy B             [T, r]
  ops::gemm(ctx_, lora_product({T, r, s->out, false, false, scale, 0.0f}, "lora_dt"), MatrixView{dy, DType::f32, 0, s->out},
            b, dt, lora_kernel(b));
  if (dropout_on_) {
    lora_input_backward_dropout(layer, *s, x, dx, lora_grad_scale_);
    return;
  }
  if (grouped) return;  // dA and dx for the group: lora_group_backward
  // dA += dt^T x                  [r, in]
  const MatrixView xb = lora_input_operand(x, s->in);
  ops::gemm(ctx_, lora_product({r, s->in, T, true, false, lora_grad_scale_, 1.0f}, "lora_da"), dt, xb,
            MatrixView{lora_.grad_a(*s), DType::f32, 0, s->in}, lora_kernel(xb));
  // dx += dt A                    [T, in], with fp32 A as lora_tb (linear_forward)
  ops::gemm(ctx_, lora_product({T, s->in, r, false, false, 1.0f, 1.0f}, "lora_dx"), dt,
            MatrixView{lora_.params(), DType::f32, s->a_offset, s->in}, MatrixView{dx, DType::f32, 0, s->in});
}

void Transformer::linear_backward_folded(const BaseLinear& lin, const LoraSlot& s, const gpu::Buffer& x,
                                         const gpu::Buffer& dy, const gpu::Buffer& dx, float beta, bool grouped,
                                         bool dy_f16, bool x_f16) {
  const uint32_t T = tokens_, r = s.rank, P = lora_pad_, K = lin.out + P;
  const float scale = lora_.scale();
  const uint32_t column = lora_column_[static_cast<int>(s.kind)];
  // Every LoRA product here reads fp16 copies only (no fp32 operand rounded while loaded):
  // dy16 [T, out + P] in input16_ (or dy itself, dy_f16), t16 (layer_backward), dt16 below, x16 for dA.
  const MatrixView dy16 = dy_f16 ? f16_copy(dy, lin.out) : base_input(dy, lin.out, false, P);
  // dB += scale * dy^T t          [out, r]   (lora_grad_scale_: see run)
  ops::gemm(ctx_, lora_product({lin.out, r, T, true, false, scale * lora_grad_scale_, 1.0f}, "lora_db"), dy16,
            MatrixView{t16_, DType::f16, column, lora_width_}, MatrixView{lora_.grad_b(s), DType::f32, 0, r},
            options_.base_kernel);
  // dt = scale * dy B             [T, r], with its fp16 copies: beside dy16 (zeros up to P) and in
  // dt16_ (for dA), written by the product's summing kernel (ops::GemmF16Copy)
  const MatrixView dt = lora_view(grad_->dt, s.kind);
  const ops::GemmF16Copy dt_copies[] = {{dy16.buffer, dy16.offset + lin.out, K, P}, {dt16_, column, lora_width_, r}};
  ops::gemm(ctx_, lora_product({T, r, lin.out, false, false, scale, 0.0f}, "lora_dt"), dy16, lora_weight(s.b_offset, r), dt,
            options_.base_kernel, dt_copies);
  // dx (=|+=) [dy | dt] [W ; A]: the LoRA part of dx inside the base product, K = out + P (dt and
  // A rounded to fp16, zero rows up to P).
  ops::gemm(ctx_, GemmShape{T, lin.in, K, false, false, 1.0f, beta}, dy16,
            dequantised(static_cast<size_t>(s.layer), s.kind, lin, FoldSide::backward, &s),
            MatrixView{dx, DType::f32, 0, lin.in}, options_.base_kernel);
  if (grouped) return;  // dA for the group: lora_group_backward
  // dA += dt^T x                  [r, in]
  const MatrixView x16 = x_f16 ? f16_copy(x, lin.in) : base_input(x, lin.in);
  ops::gemm(ctx_, lora_product({r, lin.in, T, true, false, lora_grad_scale_, 1.0f}, "lora_da"),
            MatrixView{dt16_, DType::f16, column, lora_width_}, x16, MatrixView{lora_.grad_a(s), DType::f32, 0, lin.in},
            options_.base_kernel);
}

bool Transformer::fold_side_by_side(LinearKind first, uint32_t n) const {
  const uint32_t r = static_cast<uint32_t>(lora_.settings().rank), f = static_cast<uint32_t>(first);
  if (n < 2 || f + n > fold_column_.size() || uint64_t(fold_column_[f]) + uint64_t(n) * r > lora_pad_) return false;
  for (uint32_t i = 1; i < n; ++i)
    if (fold_column_[f + i] != fold_column_[f] + i * r || lora_column_[f + i] != lora_column_[f] + i * r) return false;
  return true;
}

MatrixView Transformer::f16_copy(const gpu::Buffer& x, uint32_t cols) const {
  return MatrixView{x, DType::f16, 0, cols + lora_pad_};
}

bool Transformer::all_fold(size_t layer, std::span<const LinearKind> kinds) const {
  for (LinearKind k : kinds)
    if (!lora_folds(base_.layers[layer].linears[static_cast<int>(k)], lora_.find(static_cast<int64_t>(layer), k)))
      return false;
  return true;
}

// The fp32 [T, cols] buffers (act, h1, h2, dg, du) hold the fp16 [T, cols + lora_pad_] copy when
// cols >= lora_pad_ (2 cols halves a row >= cols + lora_pad_).
bool Transformer::down_f16(size_t layer) const {
  const uint64_t I = static_cast<uint64_t>(c_.intermediate_size);
  return !dropout_on_ && all_fold(layer, kDown) && I % 2 == 0 && I >= lora_pad_;
}

bool Transformer::qk_backward_f16(size_t layer) const {
  // FORJA_QK_BACKWARD_F16=0: RoPE's and the norms' backward as separate fp32 passes and the
  // copies after them, for measuring the difference (read once)
  static const bool on = gpu::env_flag_default_on("FORJA_QK_BACKWARD_F16");
  const uint64_t d = static_cast<uint64_t>(c_.head_dim), nkv = static_cast<uint64_t>(c_.num_kv_heads);
  return on && c_.qk_norm && !dropout_on_ && all_fold(layer, kQk) && d % 4 == 0 && nkv * d >= lora_pad_;
}

bool Transformer::norm_f16(size_t layer, bool mlp) const {
  const uint64_t H = static_cast<uint64_t>(c_.hidden_size);
  return !dropout_on_ && all_fold(layer, mlp ? std::span<const LinearKind>(kMlpInputReaders) : kAttentionInputReaders) &&
         H % 2 == 0 && H >= lora_pad_;
}

bool Transformer::mlp_backward_f16(size_t layer) const {
  const uint64_t I = static_cast<uint64_t>(c_.intermediate_size);
  return !dropout_on_ && all_fold(layer, kMlpInputReaders) && I % 2 == 0 && I >= lora_pad_;
}

void Transformer::set_dropout_seed(uint64_t seed, uint64_t step, uint64_t micro_batch) {
  dropout_stream_ = ops::dropout_stream(seed, step, micro_batch);
  dropout_seed_fresh_ = true;
}

void Transformer::lora_input_forward(size_t layer, const LoraSlot& s, const gpu::Buffer& x, const gpu::Buffer& lora_t) {
  const uint32_t T = tokens_, r = s.rank;
  const MatrixView a = lora_weight(s.a_offset, s.in);
  if (!dropout_on_) {
    ops::gemm(ctx_, lora_product({T, r, s.in, false, true}, "lora_xa"), MatrixView{x, DType::f32, 0, s.in}, a,
              lora_view(lora_t, s.kind), lora_kernel(a));
    return;
  }
  const ops::DropoutParams d = ops::dropout_params(
      lora_.settings().dropout, ops::dropout_key(dropout_stream_, layer, static_cast<uint32_t>(s.kind)));
  const uint32_t chunk = static_cast<uint32_t>(dropout_scratch_elems_ / s.in);
  for (uint32_t r0 = 0; r0 < T; r0 += chunk) {
    const uint32_t n = std::min(chunk, T - r0);
    // scratch = dropout(x[r0 : r0 + n]);  t[r0 : r0 + n] = scratch A^T
    ops::dropout_apply(ctx_, d, x, uint64_t(r0) * s.in, dropout_scratch_, 0, r0, n, s.in, false);
    ops::gemm(ctx_, lora_product({n, r, s.in, false, true}, "lora_xa"), MatrixView{dropout_scratch_, DType::f32, 0, s.in},
              a, lora_view(lora_t, s.kind, r0), lora_kernel(a));
  }
}

void Transformer::lora_input_backward_dropout(size_t layer, const LoraSlot& s, const gpu::Buffer& x,
                                              const gpu::Buffer& dx, float grad_a_scale) {
  const uint32_t T = tokens_, r = s.rank;
  const ops::DropoutParams d = ops::dropout_params(
      lora_.settings().dropout, ops::dropout_key(dropout_stream_, layer, static_cast<uint32_t>(s.kind)));
  const uint32_t chunk = static_cast<uint32_t>(dropout_scratch_elems_ / s.in);
  for (uint32_t r0 = 0; r0 < T; r0 += chunk) {
    const uint32_t n = std::min(chunk, T - r0);
    const MatrixView dt_rows = lora_view(grad_->dt, s.kind, r0);
    const MatrixView scratch{dropout_scratch_, DType::f32, 0, s.in};
    // the forward's mask, regenerated:  scratch = dropout(x[rows]);  dA += dt[rows]^T scratch
    ops::dropout_apply(ctx_, d, x, uint64_t(r0) * s.in, dropout_scratch_, 0, r0, n, s.in, false);
    ops::gemm(ctx_, lora_product({r, s.in, n, true, false, grad_a_scale, 1.0f}, "lora_da"), dt_rows, scratch,
              MatrixView{lora_.grad_a(s), DType::f32, 0, s.in});
    // scratch = dt[rows] A;  dx[rows] += mask * scratch (dropout's backward is the same mask)
    ops::gemm(ctx_, lora_product({n, s.in, r, false, false, 1.0f, 0.0f}, "lora_dx"), dt_rows,
              MatrixView{lora_.params(), DType::f32, s.a_offset, s.in}, scratch);
    ops::dropout_apply(ctx_, d, dropout_scratch_, 0, dx, uint64_t(r0) * s.in, r0, n, s.in, true);
  }
}

}  // namespace forja::model
