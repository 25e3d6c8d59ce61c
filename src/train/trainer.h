// `forja train`: a whole training run from a resolved RunConfig. Loads the model (base weights
// NF4 or 16-bit on the GPU), the adapter (fresh, --init-adapter, or a checkpoint's with --resume),
// the data; runs optimizer steps of --grad-accum micro-batches (loss = mean over all loss tokens
// of the step, as transformers' Trainer), logs to the terminal and OUT/metrics.jsonl, evaluates,
// checkpoints (train/checkpoint.h), and writes the final adapter into OUT.
//
// Data order: micro-batches form one stream, epoch 0's batches then epoch 1's ... (each epoch
// shuffled with (seed, epoch)); step s takes the next --grad-accum of them. The stream position
// (epoch, batch) is part of every checkpoint, so a resumed run sees exactly the batches the
// uninterrupted run would have, and (the kernels being deterministic) the same losses.
//
// Signals: the first SIGINT/SIGTERM/SIGUSR1 finishes the current step, saves a checkpoint and
// returns 0; a second one exits at once (the checkpoints on disk stay intact: they are written
// atomically). In a distributed run (dist/world.h) a signal on any rank stops all after the same
// step; under mpirun, SIGUSR1 to mpirun is the way to stop-and-save (it forwards it to every
// rank), since on SIGINT/SIGTERM it kills the ranks itself shortly after.
#pragma once
#include "train/run_config.h"

namespace forja::train {

// Runs training; returns the process exit code (0 also when stopped by a signal after saving).
// Throws UserError for bad input.
int run_training(const RunConfig& config);

}  // namespace forja::train
