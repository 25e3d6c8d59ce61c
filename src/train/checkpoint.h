// Checkpoints of a training run, OUT/checkpoint-STEP/:
//   adapter_model.safetensors, adapter_config.json   the LoRA adapter (PEFT format), as is usable
//   optimizer.safetensors                            AdamW's moments m and v (fp32, the adapter's
//                                                    flat parameter layout)
//   trainer_state.json                               step, data position, tokens, time, counters
//   config.yaml                                      the run's resolved configuration
//   SHA256SUMS                                       SHA-256 of each file above (sha256sum -c)
// A checkpoint is written whole into OUT/.checkpoint-STEP.partial, every file flushed, and then
// renamed into place and the directory synced: a kill at any moment (even SIGKILL half-way
// through) leaves every earlier checkpoint intact and never a half checkpoint under its real name.
// Only after the new one is in place are the oldest beyond --keep-checkpoints removed.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/adapter.h"

namespace forja::train {

// Everything besides the tensors that a resumed run needs to continue exactly.
struct TrainerState {
  int64_t step = 0;            // optimizer steps completed
  int64_t total_steps = 0;     // of the whole run (the schedule depends on it)
  int64_t epoch = 0;           // position of the next micro-batch: epoch ...
  int64_t batch_in_epoch = 0;  // ... and index within it
  int64_t tokens = 0;          // non-padding tokens trained on so far
  double elapsed_s = 0;        // training time so far
  int64_t skipped_nonfinite = 0;
  uint64_t seed = 0;
  double last_loss = 0;
  // The shape of a step when it was written: ranks (data-parallel processes) and micro-batches
  // per step over all ranks (ranks x --grad-accum). A resumed run must take steps of the same
  // micro-batches to continue exactly; 0 = not recorded (checkpoints of earlier versions).
  int64_t world_size = 1;
  int64_t micro_batches_per_step = 0;
  int64_t batch_size = 0;
};

struct Checkpoint {
  TrainerState state;
  io::Adapter adapter;
  std::vector<float> adam_m, adam_v;
};

// Writes OUT/checkpoint-STEP atomically (see above) and returns its path.
std::filesystem::path save_checkpoint(const std::filesystem::path& out_dir, const Checkpoint& checkpoint,
                                      const io::LoraTargetShapes& shapes, const std::string& config_yaml);
// Reads a checkpoint directory; UserError naming the file and the problem.
Checkpoint load_checkpoint(const std::filesystem::path& dir, const io::LoraTargetShapes& shapes);

// OUT/checkpoint-N directories, oldest first (by N).
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& out_dir);
// Removes all but the newest `keep` (keep 0: none removed).
void prune_checkpoints(const std::filesystem::path& out_dir, int64_t keep);
// Cleans up after a killed run, before its resume: removes interrupted checkpoint writes
// (.checkpoint-*.partial) and the temporaries of files being written (.NAME.tmp.*), and puts back
// a checkpoint moved aside for its replacement (.checkpoint-N.old) when the replacement never
// arrived.
void remove_partial_checkpoints(const std::filesystem::path& out_dir);
// --resume PATH: a checkpoint directory, or a run directory (its newest checkpoint), checked
// against its SHA256SUMS: a damaged one is refused naming the file, unless `fallback`
// (--resume-fallback), which passes over damaged ones to the newest good one of the run.
std::filesystem::path resolve_resume(const std::filesystem::path& path, bool fallback = false);

// Test hook: FORJA_TEST_KILL_IN_CHECKPOINT=STEP makes the process SIGKILL itself half-way through
// writing that step's checkpoint (after some files are written, before the rename), so the tests
// can check that an interrupted write never damages earlier checkpoints (util/test_hooks.h).
void maybe_kill_for_test(int64_t step);

}  // namespace forja::train
