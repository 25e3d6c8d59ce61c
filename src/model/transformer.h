// The decoder's forward and backward pass on the GPU, written out by hand (llm.c style): the
// frozen base (model/base_weights.h) with LoRA adapters (model/lora.h), for Qwen3, Qwen2, Llama
// and Mistral (formats.md 1.3-1.7). Activations are fp32; TransformerOptions::precision chooses
// the arithmetic of the products with the base weights (model/precision.h).
//
// Per layer:  h1 = rmsnorm(x); q,k,v = proj(h1) (+bias); Qwen3: per-head rmsnorm on q, k;
//             rope(q, k); a = attention(q, k, v); x2 = x + o_proj(a);
//             h2 = rmsnorm(x2); m = down(silu(gate(h2)) * up(h2)); x3 = x2 + m
// then the final norm and the LM head fused with the cross-entropy (no [T, V] logits).
//
// Backward: gradients flow to LoRA A and B only (base frozen); parameter gradients accumulate
// (+=) across micro-batches, activation gradients are written (=). In mixed precision the
// activation gradients are those of the summed loss, not the mean (a loss scale; see run). With activation
// checkpointing each layer keeps only its input; its forward is recomputed inside the backward.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "gpu/context.h"
#include "model/base_weights.h"
#include "model/block.h"
#include "model/lora.h"
#include "model/precision.h"
#include "ops/flash_attention.h"

namespace forja::model {

struct TransformerOptions {
  // fp32 needs base weights loaded with dense_dtype f32, mixed with f16 (dense_dtype_for):
  // the constructor checks (std::logic_error).
  Precision precision = Precision::fp32;
  // The kernel of the products with the base projections (dense and NF4). automatic: scalar
  // in fp32; in mixed, the cooperative-matrix kernel where present, else the fp16 scalar one.
  // Tests set coopmat_emulated to run the cooperative-matrix path on any device (mixed only).
  ops::GemmKernel base_kernel = ops::GemmKernel::automatic;
  // How mixed precision multiplies by NF4 weights. dequantized: each product first dequantises
  // its weight to fp16 into one scratch buffer (the largest projection's size), then runs the
  // dense GEMM; on an H200 that is 3-5x faster than fused, and 6x on lavapipe. fused: kernels
  // that decode W tile by tile inside the product (no fp16 copy of W; kept for tests and for
  // memory-starved devices). automatic: dequantized. fp32 always runs the fused scalar kernel.
  enum class Nf4Products { automatic, fused, dequantized };
  Nf4Products nf4_products = Nf4Products::automatic;
  // Attention's implementation. tiled: the fp32 flash-style kernels (ops/attention.h). gemm: the
  // products through the GEMM kernels with fp16 operands, in query chunks (ops/attention_gemm.h),
  // with base_kernel; mixed only. flash: the fused FlashAttention-2 kernels (ops/flash_attention.h):
  // in mixed on cooperative matrices (base_kernel coopmat_emulated: their emulation; a device
  // without them: the emulation too), in fp32 the fp32 variant; head_dim up to 128. automatic: gemm in mixed (flash is
  // slower on the H200 so far: docs/benchmarks.md), tiled in fp32.
  enum class Attention { automatic, tiled, gemm, flash };
  Attention attention = Attention::automatic;
  // Mixed only: each base product's fp32 input (x forward, dy backward) is first rounded into an
  // fp16 copy (one scratch as large as the widest input), so the GEMM stages half the bytes;
  // false rounds it inside the GEMM as it is staged (the _af32 kernels). Same values either way.
  bool fp16_input_copies = true;
  // Mixed only: the precision of LoRA's rank-r products (x A^T, t B^T and their gradients).
  // fp16: their operands in fp16 as the base products' are (the fp32 activation side rounded as
  // it is loaded or from input16_, A and B from an fp16 copy made at the start of each run, t from
  // an fp16 copy for dB), fp32 accumulation, on base_kernel's matrix cores; on an H200 the fp32
  // scalar products were 17% of the Qwen3-4B step at 3-9 TFLOP/s (docs/benchmarks.md). fp32: the
  // fp32 scalar kernels. automatic: fp16 in mixed. fp32 precision always runs fp32.
  enum class LoraProducts { automatic, fp32, fp16 };
  LoraProducts lora_products = LoraProducts::automatic;
  // Tests: attention gemm runs its fused kernels, forward and backward, in their emulation
  // (ops::AttentionGemmOptions::fused_emulated), which any device runs, so the engine's use of them
  // is checked against PyTorch on lavapipe. Mixed precision with attention gemm only.
  bool fused_attention_emulated = false;
  // With checkpointing: each layer keeps its attention output (as the fp16 [T, q_dim + lora_pad_]
  // copy o_proj reads) and log-sum-exp from the forward, so the recomputation skips attention's
  // forward and the backward reads them (2 x q_dim + 4 x heads bytes per token and layer: 585 MiB
  // at Qwen3-4B 1x2048). Where the engine cannot (model::keeps_attention_outputs: mixed precision,
  // the fused attention backward, no LoRA dropout, o_proj's LoRA folded or absent) it recomputes
  // them as before; the trainer and `forja bench` ask model::choose_kept_activations.
  bool keep_attention = true;
  // With checkpointing and LoRA: each layer keeps its LoRA inputs t = x A^T (fp32 [T, targets x
  // rank]) from the forward, so the recomputation runs none of the x A^T products (4 products
  // and their split-K sums a layer at Qwen3-4B; 448 bytes per token and layer at r16 on all
  // seven: 31.5 MiB at 1x2048). The recomputation's t would be the same bits (the products are
  // deterministic), so nothing else changes. model::keeps_lora_inputs asks the same of the
  // plan's settings; FORJA_KEEP_LORA_INPUTS=0 turns it off (TrainingSettings).
  bool keep_lora_inputs = true;
};

// One micro-batch, host side: B sequences of S tokens, row-major [B, S].
struct TokenBatch {
  uint32_t batch = 0, seq = 0;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> targets;    // the token each position predicts (shifted labels), -100 = none
  std::vector<int32_t> positions;  // RoPE positions (restart at 0 for each packed document)
  std::vector<int32_t> segments;   // packed document id, 0 = padding (attends to nothing)
  uint64_t target_count() const;
};

// Whether mixed precision keeps a Qwen3 model's q and k only as the fp16 copies the fused
// attention kernels read (ops::qk_norm_rope_f16: the q/k norm, RoPE and the rounding in one pass),
// for up to `batch` sequences of `seq`: a q/k norm, the fused attention forward and backward
// (fused_backward: they run here; emulated: their emulation, for tests) and every sequence in one
// dispatch. The Transformer and the memory plan (TrainingSettings::attention_qk_f16) both ask it.
bool attention_keeps_fp16_qk(gpu::Context& ctx, const ModelConfig& c, uint32_t batch, uint32_t seq,
                             bool fused_backward, bool emulated = false);

class Transformer {
 public:
  // Buffers for batches of up to max_batch x max_seq tokens are allocated once.
  Transformer(gpu::Context& ctx, const BaseWeights& base, LoraSet& lora, uint32_t max_batch, uint32_t max_seq,
              bool grad_checkpointing, const TransformerOptions& options = {});
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // Forward (and backward when `backward`): adds the summed loss of the batch's targets to
  // loss_sum[0] (fp32 on the GPU) and, with backward, accumulates LoRA gradients of
  // sum(loss) * inv_n. inv_n = 1 / targets in the whole optimizer step.
  void run(const TokenBatch& batch, float inv_n, const gpu::Buffer& loss_sum, bool backward);

  uint64_t activation_bytes() const { return activation_bytes_; }

  // LoRA dropout (PEFT: y = base(x) + scale * B A dropout(x), p = the LoRA settings' dropout)
  // acts in runs with backward = true when p > 0; forward-only runs (evaluation) see no dropout.
  // Its masks are hashes of (seed, step, micro_batch, layer, projection, token, feature)
  // (ops/dropout.h), so nothing is stored and the backward regenerates them. The trainer calls
  // this before every backward run (each micro-batch); a backward run with p > 0 throws
  // std::logic_error unless it was called since the previous one, so masks never repeat by
  // accident.
  void set_dropout_seed(uint64_t seed, uint64_t step, uint64_t micro_batch);

  // Mixed precision's forward range check: each base product's input, rounded into its fp16 copy
  // (fp16_input_copies), raises a flag on the GPU when a value lies beyond fp16's range (it would
  // become an infinity), one flag per layer and input (attention, o_proj, MLP, down_proj). No host
  // read happens in a step: train::step zeroes the flags at its start, and a caller whose step
  // came out non-finite asks fp16_range_report, which reads them and names the first layer and
  // input that overflowed ("" when none did, or without the check: fp32, no input copies).
  void reset_fp16_range_check();
  std::string fp16_range_report();

  // Whether the attention outputs are kept across checkpointing (TransformerOptions::keep_attention).
  bool keeps_attention() const { return keep_attention_; }
  // Whether the LoRA inputs are kept across checkpointing (TransformerOptions::keep_lora_inputs).
  bool keeps_lora_inputs() const { return !kept_t_.empty(); }

 private:
  using LayerActs = BlockActs;
  class ForwardSteps;
  struct GradScratch;
  void upload_batch(const TokenBatch& b);
  void layer_forward(size_t i, const gpu::Buffer& x_in, LayerActs& a, const gpu::Buffer* x_out);
  void layer_backward(size_t i, const gpu::Buffer& x_in, LayerActs& a, const gpu::Buffer& dx);
  // The fp16 base weight of a product: the dense one, or the NF4 one dequantised into its slot.
  ops::MatrixView base_fp16(size_t layer, LinearKind kind, const BaseLinear& lin);
  // The NF4 weight of (layer, kind) in fp16 in its slot (DequantSlot), as the forward fold reads
  // it (scale B beside W, rows [0, out)) or the backward fold ([W ; A], out + fold rows),
  // dequantised unless the slot holds this layer's W already; the view's ld is the slot's.
  enum class FoldSide { none, forward, backward };
  ops::MatrixView dequantised(size_t layer, LinearKind kind, const BaseLinear& lin, FoldSide fold,
                              const LoraSlot* s = nullptr);
  // The dequantisation of (layer, kind) ahead of its product, as linear_forward (forward) or
  // linear_backward (backward) would make it (nothing where it takes no slot): issued right after
  // the previous product, whose work does not touch this slot, it runs beside that product
  // instead of before its own.
  void prefetch_weight(size_t layer, LinearKind kind, bool backward);
  // A base product's input [T, cols]: x itself, or its fp16 copy in input16_ (mixed); ready: the
  // previous product had the same input, so input16_ holds its copy already.
  // extra: the copy's rows are cols + extra long, room for a LoRA factor beside x (lora_folds).
  // range_site >= 0: the forward range check's flag this input raises (fp16_range_report).
  ops::MatrixView base_input(const gpu::Buffer& x, uint32_t cols, bool ready = false, uint32_t extra = 0,
                             int range_site = -1);
  // The range-check flag of the input of (layer, kind): layer * 4 + {q/k/v 0, o 1, gate/up 2, down 3}.
  static int range_site(size_t layer, LinearKind kind);
  // Whether this projection's LoRA update runs inside its base product: y = [x | t] [W | s B]^T
  // forward, dx = [dy | dt] [W ; A] backward (mixed, fp16 LoRA products, NF4 weights dequantised
  // into nf4_scratch_, fp16 input copies), instead of rank-r passes over y and dx, which read and
  // write them whole: on an H100 those were 9% of the Qwen3-4B step (docs/benchmarks.md).
  bool lora_folds(const BaseLinear& lin, const LoraSlot* s) const;
  // The same for the backward: not while LoRA dropout acts.
  bool lora_folds_backward(const BaseLinear& lin, const LoraSlot* s) const;
  // y (=|+=) x W^T (+ b) + scale * (x A^T) B^T; saves x A^T in lora_t (x -> dropout(x) in the
  // LoRA path while dropout acts).
  // lora_t is the layer's [T, targets * r] buffer of LoRA inputs (LayerActs::t); with
  // lora_t_ready, lora_group_forward already wrote this projection's block; with input16_ready
  // the previous base product read the same x (q, k, v; gate, up), whose fp16 copy is reused.
  // x_f16: x already holds the fp16 [T, in + lora_pad_] copy the folded path reads (down_f16).
  // pad_t (folded): how many projections' t, from this one, this product copies into the fold
  // columns beside x (each at its fold_column_): 1 its own; n > 1 a group side by side
  // (fold_side_by_side), whose later members pass 0 and find theirs there.
  void linear_forward(size_t layer, LinearKind kind, const gpu::Buffer& x, const gpu::Buffer& y,
                      const gpu::Buffer& lora_t, bool accumulate, bool lora_t_ready = false,
                      bool input16_ready = false, bool x_f16 = false, uint32_t pad_t = 1);
  // Whether the n projections from `first` (a lora_group) have their factors side by side in the
  // fold columns: one copy of their t serves every product of the group, and nothing is written
  // between those products, so they run together (q, k and v: 512 + 128 + 128 output tiles at
  // 1x2048 on Qwen3-4B, where each alone leaves the multiprocessors partly idle).
  bool fold_side_by_side(LinearKind first, uint32_t n) const;
  // linear_backward where lora_folds: dB, dt, dx = [dy | dt] [W ; A], dA (unless grouped).
  void linear_backward_folded(const BaseLinear& lin, const LoraSlot& s, const gpu::Buffer& x, const gpu::Buffer& dy,
                              const gpu::Buffer& dx, float beta, bool grouped, bool dy_f16, bool x_f16);
  // grouped: leave dA and the LoRA part of dx to lora_group_backward. dy_f16: dy already holds
  // the fp16 [T, out + lora_pad_] copy the folded path reads (swiglu_backward_f16 made it; see
  // mlp_backward_f16), with room for dt beside it; x_f16: x is such a copy (down_f16).
  void linear_backward(size_t layer, LinearKind kind, const gpu::Buffer& x, const gpu::Buffer& lora_t,
                       const gpu::Buffer& dy, const gpu::Buffer& dx, bool accumulate_dx, bool grouped = false,
                       bool dy_f16 = false, bool x_f16 = false);
  // Whether layer's gate and up backward read their dy as fp16 copies that SwiGLU's backward
  // writes directly (into the fp32 dg / du buffers, which have room for them): both fold their
  // LoRA products, no dropout. Saves writing dg and du in fp32 and copying them.
  bool mlp_backward_f16(size_t layer) const;
  // Whether layer's q and k backward read their dy as fp16 copies that the q/k norm's backward
  // writes directly with RoPE's (ops::qk_norm_rope_backward_f16, into the fp32 dq_raw / dk_raw
  // buffers, which have room for them): Qwen3's q/k norms, both fold their LoRA products, no
  // dropout. Saves RoPE's backward passes, writing dq_raw and dk_raw in fp32 and copying them.
  bool qk_backward_f16(size_t layer) const;
  // Whether layer's SwiGLU writes act as the fp16 [T, I + lora_pad_] copy its down projection
  // reads (forward, recomputation and backward alike), into act's fp32 buffer, which has room for
  // it: down folds its LoRA products, no dropout. Saves writing act in fp32 and copying it.
  bool down_f16(size_t layer) const;
  // Likewise for the norms' outputs h1 (mlp false: the q, k, v projections' input) and h2 (mlp:
  // gate's and up's): every projection reading it folds its LoRA products, no dropout.
  bool norm_f16(size_t layer, bool mlp) const;
  // Whether every one of `kinds` in `layer` folds its LoRA products (lora_folds).
  bool all_fold(size_t layer, std::span<const LinearKind> kinds) const;
  // x as the fp16 [T, cols + lora_pad_] copy those paths write into x's own buffer.
  ops::MatrixView f16_copy(const gpu::Buffer& x, uint32_t cols) const;
  // The block of `kind` in a [T, targets * r] LoRA buffer (LayerActs::t, GradScratch::dt), from row0.
  ops::MatrixView lora_view(const gpu::Buffer& b, LinearKind kind, uint64_t row0 = 0) const;
  // LoRA factors as the B operand of a product: the fp16 copy (lora16_) or the fp32 parameters,
  // from element `offset` with row stride ld; and t's block of `kind` likewise (t16_ or lora_t).
  ops::MatrixView lora_weight(uint64_t offset, uint32_t ld) const;
  ops::MatrixView lora_t_operand(const gpu::Buffer& lora_t, LinearKind kind) const;
  // A LoRA product's B operand when it is an activation x [T, cols]: its fp16 copy in input16_
  // (lora_f16_), else x.
  ops::MatrixView lora_input_operand(const gpu::Buffer& x, uint32_t cols);
  // The kernel of a LoRA product whose B operand is `b`: base_kernel's matrix cores for fp16.
  ops::GemmKernel lora_kernel(const ops::MatrixView& b) const;
  // How many of `kinds` (projections reading one input) run their LoRA input products together
  // (LoraSet::shared_input_run; 0 when fewer than 2, or while dropout acts).
  uint32_t lora_group(size_t layer, std::initializer_list<LinearKind> kinds) const;
  // The n adapters from `first`: their t = x A^T in one product (forward); their dA += dt^T x
  // and dx += dt A in one product each (backward, after linear_backward wrote their dt).
  // Returns whether it left x's fp16 copy (with room for the folded factor) in input16_.
  // x_f16: x is the fp16 copy with room for the LoRA factor (norm_f16).
  bool lora_group_forward(size_t layer, LinearKind first, uint32_t n, const gpu::Buffer& x, const gpu::Buffer& lora_t,
                          bool x_f16 = false);
  void lora_group_backward(size_t layer, LinearKind first, uint32_t n, const gpu::Buffer& x, const gpu::Buffer& dx,
                           bool x_f16 = false);
  // lora_t's block = x A^T, or dropout(x) A^T while dropout acts.
  void lora_input_forward(size_t layer, const LoraSlot& s, const gpu::Buffer& x, const gpu::Buffer& lora_t);
  // dA += grad_a_scale * dt^T dropout(x), dx += dropout'(dt A): linear_backward's LoRA input
  // part with dropout (dt: this projection's block of GradScratch::dt).
  void lora_input_backward_dropout(size_t layer, const LoraSlot& s, const gpu::Buffer& x, const gpu::Buffer& dx,
                                   float grad_a_scale);

  gpu::Context& ctx_;
  const BaseWeights& base_;
  LoraSet& lora_;
  ModelConfig c_;
  uint32_t max_tokens_ = 0, tokens_ = 0, batch_ = 0, seq_ = 0;
  bool checkpointing_ = false;
  TransformerOptions options_;
  ops::DType base_operands_ = ops::DType::f32;  // the operand precision of the NF4 products
  // The implementation TransformerOptions::attention resolved to (never automatic), and the
  // kernel flash runs.
  TransformerOptions::Attention attention_ = TransformerOptions::Attention::tiled;
  ops::FlashKernel flash_kernel_ = ops::FlashKernel::automatic;
  bool fused_attention_forward_ = false;  // attention gemm: its forward as one fused kernel
  bool fused_attention_backward_ = false;  // and its backward as fused kernels
  bool qk_f16_ = false;                    // a.q and a.k hold fp16 copies (attention_keeps_fp16_qk)
  gpu::Buffer input16_;  // fp16 copy of a base product's input (TransformerOptions::fp16_input_copies)
  gpu::Buffer input16_source_;  // what input16_ holds a copy of (base_input), and its width
  uint32_t input16_cols_ = 0, input16_ld_ = 0;
  uint32_t lora_pad_ = 0;  // K columns a folded product gives its LoRA factor (rank rounded up); 0: none fold
  // Each kind's first column in those lora_pad_ columns, for its t beside x and its scale B beside
  // W: the projections reading one input (q, k, v; gate, up) side by side where their ranks fit in
  // lora_pad_ (the columns of the others' factors hold zeros in each one's slot), else all at 0.
  std::array<uint32_t, 7> fold_column_{};
  gpu::Buffer nf4_scratch_;  // fp16 dequantised weights (TransformerOptions::Nf4Products::dequantized)
  // A projection kind's slot in nf4_scratch_ (model::dequantised_slot_bytes), and what it holds.
  // The base is frozen, so W stays valid across runs; the LoRA blocks change with the optimizer
  // step. With checkpointing, the recomputed forward's W (and at the last layer the first
  // forward's) serves the backward of the same layer, which then writes only A's rows: one
  // dequantisation fewer per projection and layer. Separate slots also let one projection's
  // dequantisation run beside the previous projection's product.
  struct DequantSlot {
    gpu::Buffer buffer;            // a view of nf4_scratch_; invalid: no NF4 weight of this kind
    int64_t layer = -1;            // whose W it holds
    int64_t scaled_b_layer = -1;   // whose scale B is beside W (rows [0, out) past column in)
    uint64_t scaled_b_run = 0;     // written in this run (run_count_)
    int64_t a_rows_layer = -1;     // whose A is below W (rows [out, out + fold))
    uint64_t a_rows_run = 0;       // written in this run
  };
  std::array<DequantSlot, 7> dequant_slots_;
  uint64_t run_count_ = 0;
  float lora_grad_scale_ = 1.0f;                 // factor of the LoRA gradient products (run)
  // TransformerOptions::LoraProducts resolved: fp16 operands. lora16_: fp16 copy of the LoRA
  // parameters (made at the start of run); t16_: fp16 copy of the layer's t (layer_backward).
  bool lora_f16_ = false;
  gpu::Buffer lora16_, t16_;
  gpu::Buffer dt16_;  // fp16 copy of dt for dA where products fold (linear_backward_folded)
  gpu::Buffer range_flags_;  // uint32 [layers * 4]: reset_fp16_range_check
  // The LoRA buffers' row width (targets * rank) and each target's first column (lora_view).
  uint32_t lora_width_ = 0;
  std::array<uint32_t, 7> lora_column_{};
  uint64_t activation_bytes_ = 0;
  // batch inputs on the GPU (int32 [tokens])
  gpu::Buffer ids_, targets_, positions_, segments_;
  // residual stream: x_[i] is the input of layer i, x_[L] the last layer's output
  std::vector<gpu::Buffer> x_;
  std::vector<LayerActs> acts_;  // one per layer, or one shared when checkpointing
  // TransformerOptions::keep_attention resolved, and per layer the fp16 attention output with
  // room for o_proj's LoRA factor ([T, q_dim + lora_pad_]) and its log-sum-exp ([B, nh, S]).
  bool keep_attention_ = false;
  std::vector<gpu::Buffer> kept_att_, kept_lse_;
  // TransformerOptions::keep_lora_inputs resolved: per layer its t ([T, lora_width_] fp32), which
  // the forward writes and the recomputation and the backward read (empty: each layer's t is in
  // its LayerActs).
  std::vector<gpu::Buffer> kept_t_;
  const gpu::Buffer& lora_inputs(size_t layer, const LayerActs& a) const {
    return kept_t_.empty() ? a.t : kept_t_[layer];
  }
  std::unique_ptr<GradScratch> grad_;
  gpu::Buffer final_h_, final_rstd_;
  // LoRA dropout: the micro-batch's key stream, whether this run applies it, and a scratch of
  // [rows, in] for dropout(x) (and dt A in the backward): max_tokens x hidden floats, used in
  // row chunks of scratch / in tokens, so wider projections (o, down) take several chunks.
  uint64_t dropout_stream_ = 0;
  bool dropout_seed_fresh_ = false, dropout_on_ = false;
  gpu::Buffer dropout_scratch_;
  uint64_t dropout_scratch_elems_ = 0;
  std::vector<gpu::Buffer> owned_;
  gpu::Buffer alloc(uint64_t bytes, const char* what);
};

}  // namespace forja::model
