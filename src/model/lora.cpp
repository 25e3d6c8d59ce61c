#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <utility>

#include "util/error.h"

namespace forja::model {

namespace {
// Each tensor starts on a 16-byte boundary (4 floats) so views of it can be bound directly.
uint64_t align4(uint64_t n) { return (n + 3) / 4 * 4; }
}  // namespace

double LoraSettings::scale() const {
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

io::LoraConfig LoraSettings::peft_config(const std::string& base_model) const {
  io::LoraConfig c;
  c.base_model_name_or_path = base_model;
  c.r = rank;
  c.lora_alpha = alpha;
  c.lora_dropout = dropout;
  c.use_rslora = rslora;
  for (LinearKind k : kAllLinears)
    if (targets[static_cast<int>(k)]) c.target_modules.push_back(linear_name(k));
  return c;
}

LoraSettings LoraSettings::from_peft(const io::LoraConfig& c) {
  LoraSettings s;
  s.rank = c.r;
  s.alpha = c.lora_alpha;
  s.dropout = c.lora_dropout;
  s.rslora = c.use_rslora;
  s.targets.fill(false);
  for (const std::string& name : c.target_modules) {
    bool found = false;
    for (LinearKind k : kAllLinears)
      if (name == linear_name(k)) {
        s.targets[static_cast<int>(k)] = true;
        found = true;
      }
    if (!found)
      throw UserError("adapter target module '" + name +
                      "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
  }
  return s;
}

LoraSet::LoraSet(gpu::Context& ctx, const ModelConfig& config, const LoraSettings& settings)
    : ctx_(ctx), config_(config), settings_(settings) {
  if (settings.rank <= 0) throw UserError("LoRA rank must be at least 1 (--lora-rank)");
  if (!(settings.dropout >= 0.0 && settings.dropout < 1.0))
    throw UserError("LoRA dropout must be in [0, 1) (--lora-dropout, or lora_dropout in adapter_config.json), got " +
                    std::to_string(settings.dropout));
  // Per layer: the A's of its adapters in projection order, then the B's (see lora.h).
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const size_t first = slots_.size();
    for (LinearKind kind : kAllLinears) {
      if (!settings.targets[static_cast<int>(kind)]) continue;
      const LinearShape shape = linear_shape(config, kind);
      LoraSlot s;
      s.layer = layer;
      s.kind = kind;
      s.in = static_cast<uint32_t>(shape.in_features);
      s.out = static_cast<uint32_t>(shape.out_features);
      s.rank = static_cast<uint32_t>(settings.rank);
      s.a_offset = total_;
      total_ += align4(uint64_t(s.rank) * s.in);
      slots_.push_back(s);
    }
    for (size_t i = first; i < slots_.size(); ++i) {
      slots_[i].b_offset = total_;
      total_ += align4(uint64_t(slots_[i].out) * slots_[i].rank);
    }
  }
  if (slots_.empty()) throw UserError("no LoRA targets chosen (--lora-targets)");
  params_ = ctx.alloc(total_ * 4, "LoRA parameters");
  grads_ = ctx.alloc(total_ * 4, "LoRA gradients");
  ctx.fill(params_, 0);
  zero_grads();
}

LoraSet::~LoraSet() {
  ctx_.free(params_);
  ctx_.free(grads_);
}

const LoraSlot* LoraSet::find(int64_t layer, LinearKind kind) const {
  for (const LoraSlot& s : slots_)
    if (s.layer == layer && s.kind == kind) return &s;
  return nullptr;
}

void LoraSet::zero_grads() { ctx_.fill(grads_, 0); }

uint32_t LoraSet::shared_input_run(int64_t layer, std::initializer_list<LinearKind> kinds) const {
  const LoraSlot* first = nullptr;
  uint32_t n = 0;
  for (LinearKind k : kinds) {
    const LoraSlot* s = find(layer, k);
    if (!s) break;
    if (first && (s->in != first->in || s->rank != first->rank ||
                  s->a_offset != first->a_offset + uint64_t(n) * first->rank * first->in))
      break;
    if (!first) first = s;
    ++n;
  }
  return n;
}

namespace {
// Copies every tensor of v between this set's layout and slot order (each slot's A then B, every
// tensor from a multiple of 4 floats: the layout of forja's earlier parameter buffers, which
// checkpoints keep). Padding comes out zero.
std::vector<float> convert_slot_order(const std::vector<LoraSlot>& slots, uint64_t total, const std::vector<float>& v,
                                      bool to_slot_order) {
  if (v.size() != total) throw std::logic_error("LoraSet: slot-order conversion of a vector of another size");
  std::vector<float> out(total, 0.0f);
  uint64_t at = 0;
  for (const LoraSlot& s : slots)
    for (auto [here, n] : {std::pair{s.a_offset, uint64_t(s.rank) * s.in}, std::pair{s.b_offset, uint64_t(s.out) * s.rank}}) {
      if (to_slot_order)
        std::copy_n(v.begin() + here, n, out.begin() + at);
      else
        std::copy_n(v.begin() + at, n, out.begin() + here);
      at += align4(n);
    }
  return out;
}
}  // namespace

std::vector<float> LoraSet::to_slot_order(const std::vector<float>& v) const {
  return convert_slot_order(slots_, total_, v, true);
}
std::vector<float> LoraSet::from_slot_order(const std::vector<float>& v) const {
  return convert_slot_order(slots_, total_, v, false);
}

void LoraSet::init_peft(uint64_t seed) {
  // kaiming_uniform_(a=sqrt(5)) on [r, in]: bound = sqrt(6 / ((1 + 5) * in)) = 1 / sqrt(in).
  std::vector<float> host(total_, 0.0f);
  std::mt19937_64 rng(seed);
  for (const LoraSlot& s : slots_) {
    const float bound = static_cast<float>(1.0 / std::sqrt(double(s.in)));
    std::uniform_real_distribution<float> u(-bound, bound);
    for (uint64_t i = 0; i < uint64_t(s.rank) * s.in; ++i) host[s.a_offset + i] = u(rng);
  }
  ctx_.upload(params_, host);
}

void LoraSet::load(const io::Adapter& adapter) {
  const LoraSettings incoming = LoraSettings::from_peft(adapter.config);
  if (incoming.rank != settings_.rank || incoming.targets != settings_.targets)
    throw UserError("the adapter's rank or target modules differ from this run's settings");
  std::vector<float> host(total_, 0.0f);
  size_t loaded = 0;
  for (const io::LoraWeights& w : adapter.weights) {
    LinearKind kind{};
    bool known = false;
    for (LinearKind k : kAllLinears)
      if (w.target == linear_name(k)) {
        kind = k;
        known = true;
      }
    const LoraSlot* s = known ? find(w.layer, kind) : nullptr;
    if (!s) throw UserError("adapter has weights for layer " + std::to_string(w.layer) + " " + w.target +
                            ", which this model has no adapter slot for");
    if (w.a.size() != uint64_t(s->rank) * s->in || w.b.size() != uint64_t(s->out) * s->rank)
      throw UserError("adapter weights of layer " + std::to_string(w.layer) + " " + w.target +
                      " do not fit the model's projection shape");
    std::copy(w.a.begin(), w.a.end(), host.begin() + s->a_offset);
    std::copy(w.b.begin(), w.b.end(), host.begin() + s->b_offset);
    ++loaded;
  }
  if (loaded != slots_.size())
    throw UserError("adapter holds " + std::to_string(loaded) + " of the " + std::to_string(slots_.size()) +
                    " LoRA modules this model needs");
  ctx_.upload(params_, host);
}

io::Adapter LoraSet::to_adapter(const std::string& base_model) {
  std::vector<float> host = ctx_.download<float>(params_, total_);
  io::Adapter adapter;
  adapter.config = settings_.peft_config(base_model);
  // io::Adapter orders weights by layer, then by the config's target order: slots_ already are.
  for (const LoraSlot& s : slots_) {
    io::LoraWeights w;
    w.layer = s.layer;
    w.target = linear_name(s.kind);
    w.a.assign(host.begin() + s.a_offset, host.begin() + s.a_offset + uint64_t(s.rank) * s.in);
    w.b.assign(host.begin() + s.b_offset, host.begin() + s.b_offset + uint64_t(s.out) * s.rank);
    adapter.weights.push_back(std::move(w));
  }
  return adapter;
}

namespace fs = std::filesystem;

std::unique_ptr<LoraSet> load_adapter(gpu::Context& ctx, const ModelConfig& config, const fs::path& adapter_dir) {
  std::error_code ec;
  if (!fs::is_directory(adapter_dir, ec))
    throw UserError("--adapter " + adapter_dir.string() +
                    ": not a directory; give a PEFT adapter directory (adapter_config.json + "
                    "adapter_model.safetensors)");
  const io::LoraTargetShapes shapes = lora_target_shapes(config);
  io::Adapter adapter = io::load_adapter(adapter_dir, shapes);
  // target_modules may say "all-linear" or "self_attn.q_proj": LoraSettings wants plain names.
  std::vector<std::string> names;
  for (const io::LoraTarget* t :
       io::resolve_targets(adapter.config, shapes, (adapter_dir / "adapter_config.json").string()))
    names.push_back(t->name);
  adapter.config.target_modules = names;
  auto lora = std::make_unique<LoraSet>(ctx, config, LoraSettings::from_peft(adapter.config));
  lora->load(adapter);
  return lora;
}

}  // namespace forja::model
