// LoRA adapters on the GPU: for every (layer, target projection) an A [r, in] and a B [out, r],
// fp32, all in one parameter buffer so that the optimizer, the gradient norm and checkpoints
// handle them in one piece; gradients, and AdamW's two moments, are buffers of the same layout.
// Within a layer the A's come first, in projection order (q, k, v, o, gate, up, down), then the
// B's: the A's of projections that read the same input (q, k, v; gate, up) then form one
// [n*r, in] matrix, and the engine multiplies by it once (shared_input_run).
//
// Forward of a target: y = base(x) + scale * (dropout(x) A^T) B^T, scale = alpha / r (or
// alpha / sqrt(r) with rsLoRA); dropout with p = LoraSettings::dropout in [0, 1) acts in training
// runs only (model/transformer.h, ops/dropout.h). Initialisation as PEFT: A ~ U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform with
// a = sqrt(5)), B = 0, from a seed.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "gpu/context.h"
#include "io/adapter.h"
#include "model/config.h"

namespace forja::model {

struct LoraSettings {
  int64_t rank = 16;
  double alpha = 32.0;
  double dropout = 0.0;
  bool rslora = false;
  std::array<bool, 7> targets = {true, true, true, true, true, true, true};  // by LinearKind
  double scale() const;
  io::LoraConfig peft_config(const std::string& base_model) const;
  static LoraSettings from_peft(const io::LoraConfig& config);
};

// Where one adapter's tensors live inside the shared buffers (in fp32 elements).
struct LoraSlot {
  int64_t layer = 0;
  LinearKind kind = LinearKind::Q;
  uint32_t in = 0, out = 0, rank = 0;
  uint64_t a_offset = 0;  // A [rank, in]
  uint64_t b_offset = 0;  // B [out, rank]
};

class LoraSet {
 public:
  LoraSet(gpu::Context& ctx, const ModelConfig& config, const LoraSettings& settings);
  ~LoraSet();
  LoraSet(const LoraSet&) = delete;
  LoraSet& operator=(const LoraSet&) = delete;

  const LoraSettings& settings() const { return settings_; }
  float scale() const { return static_cast<float>(settings_.scale()); }
  const std::vector<LoraSlot>& slots() const { return slots_; }
  // The slot of (layer, kind), or nullptr when that projection has no adapter.
  const LoraSlot* find(int64_t layer, LinearKind kind) const;
  uint64_t parameter_count() const { return total_; }

  gpu::Buffer params() const { return params_; }  // fp32 [total]
  gpu::Buffer grads() const { return grads_; }    // fp32 [total]
  // Views of one tensor inside params/grads (byte offsets are multiples of 16).
  gpu::Buffer a(const LoraSlot& s) const { return params_.slice(s.a_offset * 4, uint64_t(s.rank) * s.in * 4); }
  gpu::Buffer b(const LoraSlot& s) const { return params_.slice(s.b_offset * 4, uint64_t(s.out) * s.rank * 4); }
  gpu::Buffer grad_a(const LoraSlot& s) const { return grads_.slice(s.a_offset * 4, uint64_t(s.rank) * s.in * 4); }
  gpu::Buffer grad_b(const LoraSlot& s) const { return grads_.slice(s.b_offset * 4, uint64_t(s.out) * s.rank * 4); }

  // How many of `kinds` (consecutive projections with the same input), from the first, have
  // adapters whose A's lie back to back with the same rank and width: the rows of one matrix
  // [n * rank, in] starting at the first one's a_offset. 0 when the first has no adapter.
  uint32_t shared_input_run(int64_t layer, std::initializer_list<LinearKind> kinds) const;

  // Host copies of a params-layout vector (the AdamW moments) in slot order: each slot's A then
  // B, every tensor from a multiple of 4 floats, the layout checkpoints keep (that of earlier
  // versions, whose parameter buffer was in slot order), and back.
  std::vector<float> to_slot_order(const std::vector<float>& v) const;
  std::vector<float> from_slot_order(const std::vector<float>& v) const;

  // PEFT initialisation (A Kaiming-uniform from `seed`, B zero).
  void init_peft(uint64_t seed);
  // Loads / returns the adapter in PEFT form (shapes checked by io::load_adapter).
  void load(const io::Adapter& adapter);
  io::Adapter to_adapter(const std::string& base_model);
  void zero_grads();

 private:
  gpu::Context& ctx_;
  ModelConfig config_;
  LoraSettings settings_;
  std::vector<LoraSlot> slots_;
  uint64_t total_ = 0;
  gpu::Buffer params_, grads_;
};

// Reads a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), checks
// every factor against the model's projection shapes (UserError otherwise) and uploads it.
std::unique_ptr<LoraSet> load_adapter(gpu::Context& ctx, const ModelConfig& config,
                                      const std::filesystem::path& adapter_dir);

}  // namespace forja::model
