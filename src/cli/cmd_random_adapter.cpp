// forja random-adapter (hidden; for interoperability tests): writes a PEFT LoRA adapter for a
// model with random A AND random, non-zero B, so that loading it changes the model's output
// (a freshly initialised adapter has B = 0 and would hide a wrongly applied one).
//   forja random-adapter --model DIR --out DIR [--rank 8] [--alpha 16] [--targets q_proj,...]
//                        [--seed 0] [--b-scale 0.05] [--rslora]
// A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's Kaiming-uniform), B ~ U(-b_scale, b_scale).
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include "cli/command.h"
#include "io/adapter.h"
#include "model/config.h"
#include "util/error.h"

namespace {

using namespace forja;

struct RandomAdapterArgs {
  std::string model, out, targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  int64_t rank = 8;
  double alpha = 16, b_scale = 0.05;
  uint64_t seed = 0;
  bool rslora = false;
};

int run_random_adapter(const RandomAdapterArgs& a) {
  if (a.rank < 1) throw UserError("--rank must be at least 1");
  const model::ModelConfig config = model::load_model_config(a.model);
  const io::LoraTargetShapes shapes = model::lora_target_shapes(config);
  io::Adapter adapter;
  adapter.config.base_model_name_or_path = a.model;
  adapter.config.r = a.rank;
  adapter.config.lora_alpha = a.alpha;
  adapter.config.use_rslora = a.rslora;
  std::stringstream ss(a.targets);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) adapter.config.target_modules.push_back(t);
  const auto targets = io::resolve_targets(adapter.config, shapes, "--targets");
  adapter.config.target_modules.clear();
  for (const io::LoraTarget* t : targets) adapter.config.target_modules.push_back(t->name);
  std::mt19937_64 rng(a.seed);
  auto uniform = [&](double bound) { return static_cast<float>((double(rng() >> 11) * 0x1.0p-53 * 2 - 1) * bound); };
  for (int64_t layer = 0; layer < config.num_layers; ++layer)
    for (const io::LoraTarget* t : targets) {
      io::LoraWeights w;
      w.layer = layer;
      w.target = t->name;
      w.a.resize(size_t(a.rank * t->in_features));
      w.b.resize(size_t(t->out_features * a.rank));
      for (float& x : w.a) x = uniform(1.0 / std::sqrt(double(t->in_features)));
      for (float& x : w.b) x = uniform(a.b_scale);
      adapter.weights.push_back(std::move(w));
    }
  io::save_adapter(a.out, adapter, shapes);
  std::printf("wrote a random adapter (rank %lld, %zu modules) to %s\n", static_cast<long long>(a.rank),
              adapter.weights.size(), a.out.c_str());
  return 0;
}

forja::cli::CommandRegistration random_adapter_registration{"random-adapter", 99, [](CLI::App& app) {
                                      auto* cmd = app.add_subcommand(
                                          "random-adapter", "Write a random LoRA adapter with non-zero B (tests)");
                                      cmd->group("");  // hidden from --help: a testing aid
                                      auto a = std::make_shared<RandomAdapterArgs>();
                                      cmd->add_option("--model", a->model, "Model directory (config.json)")->required();
                                      cmd->add_option("--out", a->out, "Adapter directory to write")->required();
                                      cmd->add_option("--rank", a->rank, "LoRA rank");
                                      cmd->add_option("--alpha", a->alpha, "LoRA alpha");
                                      cmd->add_option("--targets", a->targets, "Comma-separated projections");
                                      cmd->add_option("--seed", a->seed, "Random seed");
                                      cmd->add_option("--b-scale", a->b_scale, "B ~ U(-b, b)");
                                      cmd->add_flag("--rslora", a->rslora, "Scale alpha / sqrt(r)");
                                      return [a, cmd]() -> int {
                                        if (!cmd->parsed()) return -1;
                                        return run_random_adapter(*a);
                                      };
                                    }};

}  // namespace
