#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "model/block.h"
#include "model/transformer_parts.h"
#include "ops/attention.h"
#include "ops/attention_gemm.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/flash_attention.h"
#include "ops/gemm.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace forja::model {

using ops::DType;
using ops::GemmShape;
using ops::MatrixView;
using namespace parts;

namespace {
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

}  // namespace

uint64_t TokenBatch::target_count() const {
  uint64_t n = 0;
  for (int32_t t : targets) n += t != -100;
  return n;
}

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
  using Group = std::span<const LinearKind>;
  for (Group group : {Group(kAttentionInputReaders), Group(kMlpInputReaders)}) {
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
  // dq and dk through RoPE's backward (and Qwen3's q/k norms'): in one pass straight into the fp16
  // copies q's and k's folded backward read, or in fp32 passes
  const bool qk16 = qk_backward_f16(i);
  gpu::Buffer dq = c_.qk_norm ? g.dq_raw : g.dq, dk = c_.qk_norm ? g.dk_raw : g.dk;
  if (qk16) {
    ops::qk_norm_rope_backward_f16(ctx_, g.dq, a.q_raw, L.q_norm, a.rstd_q, positions_, base_.inv_freq, dq,
                                   nh * d + lora_pad_, T, nh, d);
    ops::qk_norm_rope_backward_f16(ctx_, g.dk, a.k_raw, L.k_norm, a.rstd_k, positions_, base_.inv_freq, dk,
                                   nkv * d + lora_pad_, T, nkv, d);
  } else {
    ops::rope_backward(ctx_, g.dq, positions_, base_.inv_freq, T, nh, d);
    ops::rope_backward(ctx_, g.dk, positions_, base_.inv_freq, T, nkv, d);
    if (c_.qk_norm) {
      ops::rmsnorm_backward(ctx_, g.dq, a.q_raw, L.q_norm, DType::f32, a.rstd_q, dq, T * nh, d, false);
      ops::rmsnorm_backward(ctx_, g.dk, a.k_raw, L.k_norm, DType::f32, a.rstd_k, dk, T * nkv, d, false);
    }
  }
  const uint32_t qkv = lora_group(i, {K::Q, K::K, K::V});
  linear_backward(i, K::Q, a.h1, t, dq, g.dh, false, qkv > 0, qk16, h1_f16);
  prefetch_weight(i, K::K, true);
  linear_backward(i, K::K, a.h1, t, dk, g.dh, true, qkv > 1, qk16, h1_f16);
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
