#!/usr/bin/env bash
# Attention alone (`forja bench attention`, fused-backward, B 1 / S 2048 / 32/8 heads x 128 with
# q, k and out in fp16 as training keeps them) of two forja binaries on one device, alternated,
# for the `device` tool (docs/benchmarks.md). From the repository root, with .dist/ and .gl/ made
# by bench/prepare_dist.sh and the baseline binary copied to .dist/forja-before:
#   OUT=... bash bench/ab_attention.sh [EXTRA ARGUMENTS...]
# writes $OUT/attn-ab.txt and prints one line per run (best of 5). AB_ROUNDS (default 2) how many
# before/after pairs; AB_BATCHES (default "1 4") the batches; extra arguments go to both binaries.
set -o pipefail
source bench/device_env.sh
OUT=${OUT:?run through the device tool, which sets OUT}
for f in .dist/forja .dist/forja-before; do
  [ -x $f ] || { echo "ab_attention.sh: $f is missing (bench/prepare_dist.sh; the baseline copied to .dist/forja-before)" >&2; exit 1; }
done
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
for batch in ${AB_BATCHES:-1 4}; do
  for bin in $(for _ in $(seq ${AB_ROUNDS:-2}); do echo before after; done); do
    f=.dist/forja; [ $bin = before ] && f=.dist/forja-before
    echo "$bin B $batch: $(timeout 60 $f $A --batch $batch "$@" 2>&1 | tail -1)" | tee -a $OUT/attn-ab.txt
  done
done
