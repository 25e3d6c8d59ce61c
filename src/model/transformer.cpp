#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "model/block.h"
#include "ops/attention.h"
#include "ops/attention_gemm.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/flash_attention.h"
#include "ops/gemm.h"
#include "ops/nf4.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace forja::model {

using ops::DType;
using ops::GemmShape;
using ops::MatrixView;

namespace {
// A LoRA product, filed under its own name in the GPU profile (FORJA_PROFILE=1): lora_xa (t = x
// A^T), lora_tb (y += s t B^T), lora_db (dB), lora_dt (dt = s dy B), lora_da (dA), lora_dx (dx +=
// dt A).
GemmShape lora_product(GemmShape s, const char* op) {
  s.op = op;
  return s;
}

using Attention = TransformerOptions::Attention;

// TransformerOptions::attention made concrete for this device and head_dim (transformer.h); sets
// flash_kernel to the kernel flash attention runs.
Attention resolve_attention(const gpu::Context& ctx, const TransformerOptions& o, uint32_t head_dim,
                            ops::FlashKernel& flash_kernel) {
  const bool mixed = o.precision == Precision::mixed;
  if (o.attention == Attention::tiled || (o.attention == Attention::automatic && !mixed)) return Attention::tiled;
  if (o.attention == Attention::gemm) return Attention::gemm;
  if (o.attention == Attention::flash) {
    flash_kernel = !mixed ? ops::FlashKernel::f32
                   : o.base_kernel == ops::GemmKernel::coopmat_emulated ? ops::FlashKernel::coopmat_emulated
                                                                        : ops::FlashKernel::automatic;
    ops::flash_attention_tiles(ctx, head_dim, {flash_kernel});  // throws, saying why, where it cannot run
    return Attention::flash;
  }
  // automatic in mixed: the GEMM path. The fused kernels are correct on an H200 but ran at 5.9
  // TFLOP/s forward + backward there against 42 for the GEMM path (docs/benchmarks.md,
  // 2026-12-05), so they are only taken when asked for.
  return Attention::gemm;
}

// The projections that read one input, in projection order.
constexpr LinearKind kAttentionInputReaders[] = {LinearKind::Q, LinearKind::K, LinearKind::V};
constexpr LinearKind kMlpInputReaders[] = {LinearKind::Gate, LinearKind::Up};
constexpr LinearKind kDown[] = {LinearKind::Down};
}  // namespace

uint64_t TokenBatch::target_count() const {
  uint64_t n = 0;
  for (int32_t t : targets) n += t != -100;
  return n;
}

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

gpu::Buffer Transformer::alloc(uint64_t bytes, const char* what) {
  gpu::Buffer b = ctx_.alloc(bytes, what);
  owned_.push_back(b);
  activation_bytes_ += b.size;
  return b;
}

Transformer::Transformer(gpu::Context& ctx, const BaseWeights& base, LoraSet& lora, uint32_t max_batch,
                         uint32_t max_seq, bool grad_checkpointing, const TransformerOptions& options)
    : ctx_(ctx), base_(base), lora_(lora), c_(base.config), checkpointing_(grad_checkpointing), options_(options) {
  const DType dense = dense_dtype_for(options.precision);
  base_operands_ = dense;
  bool matches = base.embed_dtype == dense;
  for (const BaseLayer& layer : base.layers)
    for (const BaseLinear& lin : layer.linears) matches = matches && (lin.nf4 || lin.dense_dtype == dense);
  if (!matches)
    throw std::logic_error(std::string("Transformer: --precision ") + precision_name(options.precision) +
                           " needs base weights loaded with dense_dtype = dense_dtype_for(precision)");
  if (options.precision == Precision::fp32 && options.base_kernel != ops::GemmKernel::automatic &&
      options.base_kernel != ops::GemmKernel::scalar)
    throw std::logic_error("Transformer: fp32 precision runs the scalar kernels only");
  if (options.precision == Precision::fp32 && options.attention == Attention::gemm)
    throw std::logic_error("Transformer: attention through the GEMM kernels is for mixed precision only");
  attention_ = resolve_attention(ctx, options, static_cast<uint32_t>(c_.head_dim), flash_kernel_);
  // The GEMM path's fused forward where the device runs it (and the base products are not forced
  // onto emulated or scalar kernels); asked here so that its one-time device probe waits now, not
  // inside the first step.
  fused_attention_forward_ = attention_ == Attention::gemm && options.base_kernel != ops::GemmKernel::coopmat_emulated &&
                             options.base_kernel != ops::GemmKernel::scalar &&
                             ops::attention_fused_forward_supported(ctx, static_cast<uint32_t>(c_.head_dim));
  if (options.fused_attention_emulated) {
    if (attention_ != Attention::gemm)
      throw std::logic_error("Transformer: fused_attention_emulated needs attention gemm (mixed precision)");
    fused_attention_forward_ = true;
  }
  // The fused backward wherever the fused forward runs, unless turned off (ops::AttentionGemmOptions).
  fused_attention_backward_ =
      options.fused_attention_emulated ||
      (fused_attention_forward_ && ops::attention_fused_backward_enabled(ctx, static_cast<uint32_t>(c_.head_dim)));
  qk_f16_ = fused_attention_forward_ && fused_attention_backward_ &&
            attention_keeps_fp16_qk(ctx, c_, max_batch, max_seq, true, options.fused_attention_emulated);
  using Nf4Products = TransformerOptions::Nf4Products;
  const bool dequantize = options.precision == Precision::mixed && options.nf4_products != Nf4Products::fused;
  max_tokens_ = max_batch * max_seq;
  // The column block of each target in the [T, targets * r] LoRA buffers, in projection order, so
  // that projections sharing an input sit side by side like their A's (LoraSet::shared_input_run).
  for (LinearKind k : kAllLinears)
    if (lora_.find(0, k)) {
      lora_column_[static_cast<int>(k)] = lora_width_;
      lora_width_ += static_cast<uint32_t>(lora.settings().rank);
    }
  lora_f16_ = options.precision == Precision::mixed && options.lora_products != TransformerOptions::LoraProducts::fp32 &&
              lora_width_ > 0;
  const bool input_copies = options.precision == Precision::mixed && options.fp16_input_copies;
  // LoRA folded into the NF4 products (lora_folds): K grows by the rank rounded up to whole
  // 64-deep K tiles, the largest the GEMM kernels take, so no product needs an edge tile for it.
  if (lora_f16_ && dequantize && input_copies) lora_pad_ = lora_fold_pad(lora.settings().rank);
  const uint64_t P = lora_pad_;
  for (std::span<const LinearKind> group : {std::span<const LinearKind>(kAttentionInputReaders), std::span<const LinearKind>(kMlpInputReaders)}) {
    // The adapted kinds of the group, at their columns' distance from the first one (adapted kinds
    // have consecutive column blocks in projection order).
    std::array<uint32_t, 7> at{};
    int64_t first = -1;
    bool fits = true;
    for (LinearKind k : group) {
      if (!lora_.find(0, k)) continue;
      if (first < 0) first = lora_column_[static_cast<int>(k)];
      at[static_cast<int>(k)] = lora_column_[static_cast<int>(k)] - static_cast<uint32_t>(first);
      fits = fits && at[static_cast<int>(k)] + uint64_t(lora.settings().rank) <= P;
    }
    if (fits)
      for (LinearKind k : group) fold_column_[static_cast<int>(k)] = at[static_cast<int>(k)];
  }
  if (dequantize) {
    // A slot per projection kind, for its largest layer: W with room for the LoRA factors beside
    // and below it (DequantSlot).
    std::array<uint64_t, 7> bytes{};
    for (const BaseLayer& layer : base.layers)
      for (size_t k = 0; k < bytes.size(); ++k)
        if (const BaseLinear& lin = layer.linears[k]; lin.nf4)
          bytes[k] = std::max(bytes[k], dequantised_slot_bytes(lin.out, lin.in, static_cast<uint32_t>(P)));
    uint64_t total = 0;
    for (uint64_t b : bytes) total += b;
    if (total > 0) {
      nf4_scratch_ = alloc(total, "nf4 dequantised weights (fp16)");
      // The zero rows below A (the backward fold's K padding) are never written after this.
      ctx_.fill(nf4_scratch_, 0);
      uint64_t at = 0;
      for (size_t k = 0; k < bytes.size(); ++k) {
        if (bytes[k] > 0) dequant_slots_[k].buffer = nf4_scratch_.slice(at, bytes[k]);
        at += bytes[k];
      }
    }
  }
  if (input_copies) {
    uint64_t widest = 0;
    for (const BaseLayer& layer : base.layers)
      for (const BaseLinear& lin : layer.linears) widest = std::max<uint64_t>({widest, lin.in, lin.out});
    if (widest > 0)
      input16_ = alloc((uint64_t(max_tokens_) * (widest + P) * 2 + 3) / 4 * 4, "base product input (fp16)");
    range_flags_ = alloc(uint64_t(std::max<int64_t>(c_.num_layers, 1)) * 4 * 4, "fp16 range flags");
    ctx_.fill(range_flags_, 0);
  }
  if (lora_pad_ > 0) dt16_ = alloc((uint64_t(max_tokens_) * lora_width_ * 2 + 3) / 4 * 4, "lora dt (fp16)");
  if (lora_f16_) {
    lora16_ = alloc((lora_.params().size / 4 * 2 + 3) / 4 * 4, "LoRA parameters (fp16 copy)");
    t16_ = alloc((uint64_t(max_tokens_) * lora_width_ * 2 + 3) / 4 * 4, "lora t (fp16)");
  }
  const uint64_t T = max_tokens_, H = c_.hidden_size, I = c_.intermediate_size, nh = c_.num_heads,
                 d = c_.head_dim;
  ids_ = alloc(T * 4, "input ids");
  targets_ = alloc(T * 4, "targets");
  positions_ = alloc(T * 4, "positions");
  segments_ = alloc(T * 4, "segments");
  for (int64_t i = 0; i <= c_.num_layers; ++i) x_.push_back(alloc(T * H * 4, "residual stream"));
  // One layer's activations (per layer, or one set with checkpointing) and the shared activation
  // gradients, allocated from the block table (model/block.h) that the memory plan sums.
  using Grad = gpu::Buffer GradScratch::*;
  static const std::pair<const char*, Grad> grad_fields[] = {
      {"dx", &GradScratch::dx},         {"dh", &GradScratch::dh},         {"datt", &GradScratch::datt},
      {"dq", &GradScratch::dq},         {"dk", &GradScratch::dk},         {"dv", &GradScratch::dv},
      {"dq_raw", &GradScratch::dq_raw}, {"dk_raw", &GradScratch::dk_raw}, {"dgate", &GradScratch::dg},
      {"dup", &GradScratch::du},        {"dswiglu", &GradScratch::dact},  {"lora dt", &GradScratch::dt}};
  auto grad_field = [](const char* name) {
    for (const auto& [n, f] : grad_fields)
      if (std::string_view(n) == name) return f;
    throw std::logic_error(std::string("Transformer: the block table's tensor '") + name + "' has no buffer");
  };
  const size_t n_acts = checkpointing_ ? 1 : static_cast<size_t>(c_.num_layers);
  for (size_t i = 0; i < n_acts; ++i)
    acts_.push_back(allocate_block_acts(c_, lora_width_, T, [&](uint64_t bytes, const char* what) { return alloc(bytes, what); }));
  const std::vector<BlockTensor> block = block_tensors(c_, lora_width_);
  grad_ = std::make_unique<GradScratch>();
  for (const BlockTensor& t : block)
    if (t.role == BlockRole::gradient) (*grad_).*grad_field(t.name) = alloc(T * t.per_token * 4, t.name);
  // Attention outputs kept across checkpointing, where o_proj's product reads its input as the
  // fp16 copy (folded LoRA, or none: linear_forward) and the backward is the fused one (it takes
  // out as that copy); model::keeps_attention_outputs asks the same of the settings.
  ops::AttentionGemmOptions fused_options;
  fused_options.fused_emulated = options.fused_attention_emulated;
  keep_attention_ = checkpointing_ && options.keep_attention && attention_ == Attention::gemm &&
                    fused_attention_backward_ && input16_.valid() && lora_.settings().dropout == 0 &&
                    ops::attention_fused_kernels_run(ctx_, static_cast<uint32_t>(d), fused_options);
  for (size_t i = 0; keep_attention_ && i < static_cast<size_t>(c_.num_layers); ++i) {
    const BaseLinear& o = base.layers[i].linears[static_cast<int>(LinearKind::O)];
    const LoraSlot* s = lora_.find(static_cast<int64_t>(i), LinearKind::O);
    keep_attention_ = s ? lora_folds(o, s) : !o.nf4 || nf4_scratch_.valid();
  }
  if (keep_attention_)
    for (int64_t i = 0; i < c_.num_layers; ++i) {
      kept_att_.push_back(alloc((T * (nh * d + P) * 2 + 3) / 4 * 4, "kept attention output (fp16)"));
      kept_lse_.push_back(alloc(T * nh * 4, "kept attention lse"));
    }
  if (checkpointing_ && options.keep_lora_inputs && lora_width_ > 0)
    for (int64_t i = 0; i < c_.num_layers; ++i) kept_t_.push_back(alloc(T * lora_width_ * 4, "kept LoRA inputs t"));
  final_h_ = alloc(T * H * 4, "final norm");
  final_rstd_ = alloc(T * 4, "final rstd");
  if (lora_.settings().dropout > 0) {
    // at least one row of the widest projection input, so every chunk holds a row
    dropout_scratch_elems_ = std::max<uint64_t>({T * H, I, nh * d});
    dropout_scratch_ = alloc(dropout_scratch_elems_ * 4, "lora dropout scratch");
  }
}

Transformer::~Transformer() {
  for (auto& b : owned_) ctx_.free(b);
}

void Transformer::upload_batch(const TokenBatch& b) {
  const uint64_t T = uint64_t(b.batch) * b.seq;
  if (T == 0 || T > max_tokens_) throw std::logic_error("Transformer: batch larger than the planned buffers");
  if (b.input_ids.size() != T || b.targets.size() != T || b.positions.size() != T || b.segments.size() != T)
    throw std::logic_error("Transformer: batch arrays do not match batch x seq");
  batch_ = b.batch;
  seq_ = b.seq;
  tokens_ = static_cast<uint32_t>(T);
  // Recorded into the command stream: no wait for the GPU between micro-batches (train/step.h).
  ctx_.update(ids_, b.input_ids);
  ctx_.update(targets_, b.targets);
  ctx_.update(positions_, b.positions);
  ctx_.update(segments_, b.segments);
}

bool attention_keeps_fp16_qk(gpu::Context& ctx, const ModelConfig& c, uint32_t batch, uint32_t seq, bool fused_backward,
                             bool emulated) {
  if (!c.qk_norm || !fused_backward || c.head_dim % 4 != 0) return false;
  ops::AttentionGemmOptions o;
  o.fused_emulated = emulated;
  return ops::attention_gemm_takes_f16_qk(ctx, batch, seq, static_cast<uint32_t>(c.num_heads),
                                          static_cast<uint32_t>(c.num_kv_heads), static_cast<uint32_t>(c.head_dim), o);
}

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
    if (fold_column_[f + i] != fold_column_[f] + i * r ||
        lora_column_[f + i] != lora_column_[f] + i * r)
      return false;
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

// The training engine's steps of a layer's forward (block_forward): its projections, where the
// projections that read one input (q, k, v of h1; gate, up of h2) make their LoRA inputs in one
// product at the first of them and reuse the first one's fp16 copy of the input, and its
// attention implementation.
class Transformer::ForwardSteps : public BlockSteps {
 public:
  // recompute: the checkpointing recomputation inside the backward (which skips attention's
  // forward where its outputs are kept).
  ForwardSteps(Transformer& engine, size_t layer, LayerActs& acts, bool recompute)
      : e_(engine), layer_(layer), t_(engine.lora_inputs(layer, acts)), recompute_(recompute),
        t_kept_(recompute && engine.keeps_lora_inputs()) {}

  void linear(LinearKind kind, const gpu::Buffer& x, const gpu::Buffer& y, bool accumulate) override {
    using K = LinearKind;
    if (kind == K::O && e_.keep_attention_) {
      // o_proj reads the kept fp16 copy of the attention output: made here from the forward's
      // fp32 output, found there by the recomputation (which computed no attention).
      const gpu::Buffer& kept = e_.kept_att_[layer_];
      const uint32_t in = static_cast<uint32_t>(e_.c_.q_dim());
      if (!recompute_) {
        const ops::Fp16RangeFlag flag{e_.range_flags_, static_cast<uint32_t>(e_.range_site(layer_, K::O))};
        ops::to_f16_block(e_.ctx_, x, 0, in, kept, 0, in + e_.lora_pad_, e_.tokens_, in, in, 1.0f,
                          e_.range_flags_.valid() ? &flag : nullptr);
      }
      e_.linear_forward(layer_, kind, kept, y, t_, accumulate, t_kept_, false, true);
      e_.prefetch_weight(layer_, K::Gate, false);
      return;
    }
    bool t_ready = false, input16_ready = false;
    uint32_t pad_t = 1;  // linear_forward's: this projection copies its own t beside x
    // x is already the fp16 copy: down's input (down_f16) or a norm's output (norm_f16); o_proj's
    // input, the attention output, is fp32.
    const bool x_f16 = kind == K::Down ? e_.down_f16(layer_)
                       : kind == K::O  ? false
                                       : e_.norm_f16(layer_, kind == K::Gate || kind == K::Up);
    if (kind == K::Q || kind == K::Gate) {
      first_ = kind;
      group_ = kind == K::Q ? e_.lora_group(layer_, {K::Q, K::K, K::V}) : e_.lora_group(layer_, {K::Gate, K::Up});
      side_by_side_ = group_ > 0 && e_.all_fold(layer_, {&kind, 1}) && e_.fold_side_by_side(kind, group_);
      // The group's products then run together: their weights are dequantised now, beside the
      // LoRA input product, instead of each beside the product before it (a write between two of
      // the group's products would hold the second back until the first is done).
      if (side_by_side_)
        for (uint32_t i = 1; i < group_; ++i)
          e_.prefetch_weight(layer_, static_cast<K>(static_cast<int>(kind) + static_cast<int>(i)), false);
      // (a kept t: no product for the group; the first base product makes x's fp16 copy)
      group16_ = group_ && !t_kept_ && e_.lora_group_forward(layer_, kind, group_, x, t_, x_f16);
      t_ready = group_ > 0;
      input16_ready = group16_;
      if (side_by_side_) pad_t = group_;
    } else if (kind == K::K || kind == K::V || kind == K::Up) {
      const uint32_t index = static_cast<uint32_t>(kind) - static_cast<uint32_t>(first_);  // in its group
      t_ready = group_ > index;
      input16_ready = true;  // the group's first base product made the copy
      if (side_by_side_ && group_ > index) pad_t = 0;  // the first one's copy put this t there
    }
    e_.linear_forward(layer_, kind, x, y, t_, accumulate, t_ready || t_kept_, input16_ready, x_f16, pad_t);
    // The next projection's weight, dequantised while this product runs (the recomputation's
    // down_proj too: its backward then finds W in the slot).
    if (kind != K::Down) e_.prefetch_weight(layer_, static_cast<K>(static_cast<int>(kind) + 1), false);
  }

  void norm(gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w, const gpu::Buffer& y, const gpu::Buffer& rstd,
            uint32_t tokens, uint32_t cols, float eps, bool mlp) override {
    if (!mlp) e_.prefetch_weight(layer_, LinearKind::Q, false);  // q_proj's weight beside the norm
    if (!e_.norm_f16(layer_, mlp)) return BlockSteps::norm(ctx, x, w, y, rstd, tokens, cols, eps, mlp);
    const ops::Fp16RangeFlag flag{e_.range_flags_,
                                  static_cast<uint32_t>(e_.range_site(layer_, mlp ? LinearKind::Gate : LinearKind::Q))};
    ops::rmsnorm_forward_f16(ctx, x, w, y, rstd, tokens, cols, cols + e_.lora_pad_, eps,
                             e_.range_flags_.valid() ? &flag : nullptr);
  }

  void position(gpu::Context& ctx, const BaseWeights& base, size_t layer, uint32_t tokens,
                const gpu::Buffer& positions, const BlockActs& a) override {
    if (!e_.qk_f16_) return BlockSteps::position(ctx, base, layer, tokens, positions, a);
    const ModelConfig& c = base.config;
    const BaseLayer& L = base.layers[layer];
    const uint32_t nh = static_cast<uint32_t>(c.num_heads), nkv = static_cast<uint32_t>(c.num_kv_heads),
                   d = static_cast<uint32_t>(c.head_dim);
    const float eps = static_cast<float>(c.rms_norm_eps);
    ops::qk_norm_rope_f16(ctx, a.q_raw, L.q_norm, a.q, a.rstd_q, positions, base.inv_freq, tokens, nh, d, eps);
    ops::qk_norm_rope_f16(ctx, a.k_raw, L.k_norm, a.k, a.rstd_k, positions, base.inv_freq, tokens, nkv, d, eps);
  }

  void activation(gpu::Context& ctx, const BlockActs& a, uint32_t tokens, uint32_t cols) override {
    if (!e_.down_f16(layer_)) return BlockSteps::activation(ctx, a, tokens, cols);
    const ops::Fp16RangeFlag flag{e_.range_flags_, static_cast<uint32_t>(e_.range_site(layer_, LinearKind::Down))};
    ops::swiglu_forward_f16(ctx, a.g, a.u, a.act, tokens, cols, cols + e_.lora_pad_,
                            e_.range_flags_.valid() ? &flag : nullptr);
  }

  void attention(const BlockActs& a) override {
    if (e_.keep_attention_ && recompute_) return;  // o_proj and the backward read the kept output
    const gpu::Buffer& lse = e_.keep_attention_ ? e_.kept_lse_[layer_] : a.lse;
    const ModelConfig& c = e_.c_;
    const uint32_t nh = static_cast<uint32_t>(c.num_heads), nkv = static_cast<uint32_t>(c.num_kv_heads),
                   d = static_cast<uint32_t>(c.head_dim);
    const float scale = static_cast<float>(1.0 / std::sqrt(double(d)));
    if (e_.attention_ == Attention::flash) {
      ops::flash_attention_forward(e_.ctx_, a.q, a.k, a.v, e_.segments_, a.att, a.lse, e_.batch_, e_.seq_, nh, nkv, d,
                                   scale, {e_.flash_kernel_});
    } else if (e_.attention_ == Attention::gemm) {
      ops::AttentionGemmOptions ao{e_.options_.base_kernel};
      ao.fused_forward = e_.fused_attention_forward_;
      ao.fused_emulated = e_.options_.fused_attention_emulated;
      ao.qk_f16 = e_.qk_f16_;
      ops::attention_gemm_forward(e_.ctx_, a.q, a.k, a.v, e_.segments_, a.att, lse, e_.batch_, e_.seq_, nh, nkv, d,
                                  scale, ao);
    } else {
      ops::attention_forward(e_.ctx_, a.q, a.k, a.v, e_.segments_, a.att, a.lse, e_.batch_, e_.seq_, nh, nkv, d, scale);
    }
  }

  // A recomputation for the backward: of the down projection only its LoRA input t is needed.
  void down_input(const gpu::Buffer& act) override {
    const LoraSlot* s = e_.lora_.find(static_cast<int64_t>(layer_), LinearKind::Down);
    if (!s || t_kept_) return;
    if (!e_.down_f16(layer_)) return e_.lora_input_forward(layer_, *s, act, t_);
    // t = act A^T from act's fp16 copy (activation above), as linear_forward's folded path does
    const uint32_t in = s->in;
    ops::gemm(e_.ctx_, lora_product({e_.tokens_, s->rank, in, false, true}, "lora_xa"),
              e_.f16_copy(act, in), e_.lora_weight(s->a_offset, in),
              e_.lora_view(t_, LinearKind::Down), e_.options_.base_kernel);
  }

 private:
  Transformer& e_;
  size_t layer_;
  const gpu::Buffer& t_;  // the layer's LoRA inputs t (Transformer::lora_inputs)
  bool recompute_ = false;
  bool t_kept_ = false;   // the recomputation of a layer whose t the forward kept: no x A^T products
  LinearKind first_ = LinearKind::Q;  // the first projection of the current input group
  uint32_t group_ = 0;                // its lora_group
  bool group16_ = false;              // lora_group_forward left the input's fp16 copy
  bool side_by_side_ = false;         // the group's t share one copy beside x (fold_side_by_side)
};

void Transformer::layer_forward(size_t i, const gpu::Buffer& x_in, LayerActs& a, const gpu::Buffer* x_out) {
  ForwardSteps steps(*this, i, a, checkpointing_ && !x_out);
  block_forward(ctx_, base_, i, tokens_, positions_, x_in, a, x_out, steps);
}

void Transformer::layer_backward(size_t i, const gpu::Buffer& x_in, LayerActs& a, const gpu::Buffer& dx) {
  const BaseLayer& L = base_.layers[i];
  const uint32_t T = tokens_, H = static_cast<uint32_t>(c_.hidden_size), I = static_cast<uint32_t>(c_.intermediate_size);
  const uint32_t nh = static_cast<uint32_t>(c_.num_heads), nkv = static_cast<uint32_t>(c_.num_kv_heads),
                 d = static_cast<uint32_t>(c_.head_dim);
  GradScratch& g = *grad_;
  using K = LinearKind;
  const gpu::Buffer& t = lora_inputs(i, a);
  if (lora_f16_) ops::to_f16(ctx_, t, t16_, uint64_t(T) * lora_width_);  // the dB products' t

  // MLP: dx is the gradient of x3 = x2 + down(act)
  // Each projection's weight is prefetched right after the previous product (prefetch_weight):
  // Down, Gate, Up, O, then Q beside the attention's backward, K, V.
  linear_backward(i, K::Down, a.act, t, dx, g.dact, false, false, false, down_f16(i));
  prefetch_weight(i, K::Gate, true);
  const bool mlp16 = mlp_backward_f16(i);
  if (mlp16)
    ops::swiglu_backward_f16(ctx_, a.g, a.u, g.dact, g.dg, g.du, T, I, I + lora_pad_);
  else
    ops::swiglu_backward(ctx_, a.g, a.u, g.dact, g.dg, g.du, uint64_t(T) * I);
  const uint32_t mlp = lora_group(i, {K::Gate, K::Up});
  const bool h2_f16 = norm_f16(i, true), h1_f16 = norm_f16(i, false);
  linear_backward(i, K::Gate, a.h2, t, g.dg, g.dh, false, mlp > 0, mlp16, h2_f16);
  prefetch_weight(i, K::Up, true);
  linear_backward(i, K::Up, a.h2, t, g.du, g.dh, true, mlp > 1, mlp16, h2_f16);
  prefetch_weight(i, K::O, true);
  if (mlp) lora_group_backward(i, K::Gate, mlp, a.h2, g.dh, h2_f16);
  ops::rmsnorm_backward(ctx_, g.dh, a.x2, L.post_norm, DType::f32, a.rstd2, dx, T, H, true);  // dx: grad of x2

  // Attention: x2 = x + o_proj(att)
  // (the kept attention output: its fp16 copy, as o_proj's forward read it)
  const gpu::Buffer& att = keep_attention_ ? kept_att_[i] : a.att;
  const gpu::Buffer& lse = keep_attention_ ? kept_lse_[i] : a.lse;
  linear_backward(i, K::O, att, t, dx, g.datt, false, false, false, keep_attention_);
  prefetch_weight(i, K::Q, true);
  const float scale = static_cast<float>(1.0 / std::sqrt(double(d)));
  if (attention_ == Attention::flash) {
    ops::flash_attention_backward(ctx_, a.q, a.k, a.v, segments_, a.att, a.lse, g.datt, g.dq, g.dk, g.dv, batch_,
                                  seq_, nh, nkv, d, scale, {flash_kernel_});
  } else if (attention_ == Attention::gemm) {
    ops::AttentionGemmOptions ao{options_.base_kernel};
    ao.fused_backward = fused_attention_backward_;
    ao.fused_emulated = options_.fused_attention_emulated;
    ao.qk_f16 = qk_f16_;
    if (keep_attention_) ao.out_f16_ld = nh * d + lora_pad_;
    ops::attention_gemm_backward(ctx_, a.q, a.k, a.v, segments_, att, lse, g.datt, g.dq, g.dk, g.dv, batch_, seq_,
                                 nh, nkv, d, scale, ao);
  } else {
    ops::attention_backward(ctx_, a.q, a.k, a.v, segments_, a.att, a.lse, g.datt, g.dq, g.dk, g.dv, batch_, seq_, nh,
                            nkv, d, scale);
  }
  ops::rope_backward(ctx_, g.dq, positions_, base_.inv_freq, T, nh, d);
  ops::rope_backward(ctx_, g.dk, positions_, base_.inv_freq, T, nkv, d);
  gpu::Buffer dq = g.dq, dk = g.dk;
  if (c_.qk_norm) {
    ops::rmsnorm_backward(ctx_, g.dq, a.q_raw, L.q_norm, DType::f32, a.rstd_q, g.dq_raw, T * nh, d, false);
    ops::rmsnorm_backward(ctx_, g.dk, a.k_raw, L.k_norm, DType::f32, a.rstd_k, g.dk_raw, T * nkv, d, false);
    dq = g.dq_raw;
    dk = g.dk_raw;
  }
  const uint32_t qkv = lora_group(i, {K::Q, K::K, K::V});
  linear_backward(i, K::Q, a.h1, t, dq, g.dh, false, qkv > 0, false, h1_f16);
  prefetch_weight(i, K::K, true);
  linear_backward(i, K::K, a.h1, t, dk, g.dh, true, qkv > 1, false, h1_f16);
  prefetch_weight(i, K::V, true);
  linear_backward(i, K::V, a.h1, t, g.dv, g.dh, true, qkv > 2, false, h1_f16);
  if (qkv) lora_group_backward(i, K::Q, qkv, a.h1, g.dh, h1_f16);
  ops::rmsnorm_backward(ctx_, g.dh, x_in, L.input_norm, DType::f32, a.rstd1, dx, T, H, true);  // dx: grad of x
}

void Transformer::run(const TokenBatch& batch, float inv_n, const gpu::Buffer& loss_sum, bool backward) {
  upload_batch(batch);
  ++run_count_;  // the LoRA factors may have changed since the last run (DequantSlot)
  dropout_on_ = backward && lora_.settings().dropout > 0;
  if (dropout_on_) {
    if (!dropout_seed_fresh_)
      throw std::logic_error("Transformer::run: LoRA dropout needs set_dropout_seed before every backward run");
    dropout_seed_fresh_ = false;
  }
  const uint32_t T = tokens_, H = static_cast<uint32_t>(c_.hidden_size), V = static_cast<uint32_t>(c_.vocab_size);
  const size_t L = static_cast<size_t>(c_.num_layers);
  // The LoRA factors as this run's fp16 products read them (the optimizer changed them since).
  if (lora_f16_) ops::to_f16(ctx_, lora_.params(), lora16_, lora_.params().size / 4);
  ops::embedding_forward(ctx_, base_.embedding, base_.embed_dtype, ids_, x_[0], T, H, V);
  for (size_t i = 0; i < L; ++i) layer_forward(i, x_[i], acts_[checkpointing_ ? 0 : i], &x_[i + 1]);
  ops::rmsnorm_forward(ctx_, x_[L], base_.final_norm, DType::f32, final_h_, final_rstd_, T, H,
                       static_cast<float>(c_.rms_norm_eps));
  ops::CrossEntropyOptions ce;
  ce.need_grad = backward;
  // Mixed precision rounds activation gradients to fp16 where they enter the base products; at
  // the scale of the mean loss (inv_n ~ 1e-4 for real batches) they would fall into fp16's
  // subnormals. So the backward carries the gradient of the summed loss (per-token dlogits in
  // [-1, 1]; every backward op is linear in its upstream gradient) and inv_n is applied where
  // the LoRA gradients accumulate: a static loss scale of n that keeps per-token gradients of
  // order one, far from both ends of fp16's range.
  const bool scaled = options_.precision == Precision::mixed;
  lora_grad_scale_ = scaled ? inv_n : 1.0f;
  ops::lm_head_cross_entropy(ctx_, final_h_, base_.lm_head, base_.embed_dtype, targets_, T, H, V,
                             scaled ? 1.0f : inv_n, loss_sum,
                             grad_->dh, ce);
  if (!backward) return;
  ops::rmsnorm_backward(ctx_, grad_->dh, x_[L], base_.final_norm, DType::f32, final_rstd_, grad_->dx, T, H, false);
  for (size_t i = L; i-- > 0;) {
    LayerActs& a = acts_[checkpointing_ ? 0 : i];
    if (checkpointing_) layer_forward(i, x_[i], a, nullptr);  // recompute what the backward needs
    layer_backward(i, x_[i], a, grad_->dx);
  }
}

}  // namespace forja::model
