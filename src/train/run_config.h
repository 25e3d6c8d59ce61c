// The configuration of a training run: every setting of `forja train`, its default, and how it is
// read from a YAML file (--config run.yaml) and from flags (flags win). One table of keys serves
// both, so a YAML key is always spelled like its flag without the dashes in front
// (`lora-rank: 16` <-> `--lora-rank 16`), and OUT/config.yaml, which a run writes, can be given
// back as --config to repeat it. Settings that take one of a few words (quant, precision,
// lr-schedule) are enums here; the table turns words into them, naming the valid ones in errors,
// and back into the same words for config.yaml.
//
// Defaults are the usual QLoRA ones (Dettmers et al. 2023 and PEFT's examples): NF4 with double
// quantisation, LoRA on all seven projections with r 16 / alpha 32 / dropout 0.05, lr 2e-4 with a constant
// schedule after a warm-up of 3% of the steps, AdamW betas (0.9, 0.999), no weight decay,
// gradient clipping at 0.3, an effective batch of 16 sequences (4 x 4 accumulation).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/base_weights.h"
#include "model/precision.h"
#include "train/schedule.h"

namespace forja::train {

enum class Toggle { automatic, on, off };

struct RunConfig {
  // paths
  std::filesystem::path model, data, out, eval_data, init_adapter, resume;
  // data
  double eval_split = 0.0;
  int64_t seq_len = 2048;
  Toggle packing = Toggle::automatic;  // auto: on when every example is {"text"}
  bool no_shuffle = false;
  bool train_on_inputs = false;
  std::string chat_template;  // "" = detect from tokenizer_config.json
  // schedule of the run
  int64_t batch_size = 4;
  int64_t grad_accum = 4;
  int64_t epochs = 1;
  int64_t max_steps = 0;      // > 0: stop after this many optimizer steps (overrides epochs)
  int64_t warmup_steps = -1;  // -1: 3% of the steps, rounded up
  // optimizer
  double lr = 2e-4;
  Schedule lr_schedule = Schedule::constant;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double max_grad_norm = 0.3;  // 0: no clipping
  // adapter
  int64_t lora_rank = 16;
  double lora_alpha = 32.0;
  double lora_dropout = 0.05;
  std::vector<std::string> lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj",
                                           "gate_proj", "up_proj", "down_proj"};
  bool rslora = false;
  // engine
  model::BaseQuant quant = model::BaseQuant::nf4;
  bool double_quant = true;
  model::PrecisionChoice precision;  // empty: auto, which the trainer resolves on the device (model/precision.h)
  Toggle grad_checkpointing = Toggle::automatic;  // auto: on when seq-len >= 1024
  uint64_t seed = 42;
  int device = -1;
  // outputs
  int64_t save_every = 200;       // steps between checkpoints (0: only at the end)
  int64_t keep_checkpoints = 3;   // the newest K are kept (0: keep all)
  int64_t eval_every = 0;         // steps between evaluations (0: at the end only)
  int64_t log_every = 10;
  bool overwrite = false;
  bool skip_nonfinite = false;
  bool resume_fallback = false;  // --resume passes over damaged checkpoints to the newest good one

  // Which keys were set explicitly (by file or flag), for messages and resume checks.
  std::map<std::string, std::string> explicitly_set;

  // Sets one key from its text form; `source` ("--lr" or "run.yaml: lr") names it in errors.
  // Unknown keys are a UserError that suggests the nearest valid name.
  void set(const std::string& key, const std::string& value, const std::string& source);
  // Reads a YAML mapping of key: value (relative paths are taken relative to the file's folder).
  void load_yaml(const std::filesystem::path& file);
  // Range checks and required paths; UserError naming the key and the fix.
  void validate() const;
  // The resolved configuration as YAML, every key, in table order (paths absolute).
  std::string to_yaml() const;

  bool checkpointing() const { return grad_checkpointing == Toggle::automatic ? seq_len >= 1024 : grad_checkpointing == Toggle::on; }
  // Warm-up steps for a run of `total_steps`.
  int64_t warmup_for(int64_t total_steps) const;
};

// Every key, in the order --help and config.yaml show them.
struct ConfigKey {
  const char* name;
  const char* value_hint;  // e.g. "N", "PATH", "{constant,linear,cosine}"; "" for a bare flag
  const char* help;
};
const std::vector<ConfigKey>& config_keys();
std::vector<std::string> config_key_names();

}  // namespace forja::train
