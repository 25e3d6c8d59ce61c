#!/usr/bin/env bash
# Run 29, prepared in the tenth session (2026-12-07) and not run (the session's device time ran
# out): the profiler with both timestamps at the bottom of the pipe (run 28's serial profile
# added up to 371.6 ms a step against 333.4 measured: a start timestamp at the top of the pipe
# took in the previous dispatch's time). The 1x2048 step profiled by shape (overlap kept) and
# serially (each op alone), and `forja bench gemm`'s own products serially, to see how far the
# products run from their speed alone inside the step; then the step itself (the split-K sums
# now write dt's fp16 copies, unmeasured). After `bash bench/prepare_dist.sh`, with carry
# [".gl", ".dist"]: OUT=$OUT bash docs/results/prepared-2026-12-07-run29-script.sh
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
F=.dist/forja SECONDS=0
B="bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1"
FORJA_PROFILE=shapes timeout 60 $F $B > $OUT/profile-shapes.txt 2>&1; echo "shapes done at $SECONDS s"
FORJA_PROFILE=serial timeout 60 $F $B > $OUT/profile-serial.txt 2>&1; echo "serial done at $SECONDS s"
FORJA_PROFILE=serial timeout 60 $F bench gemm --sizes 2048x9728x2624,2048x2560x9792,2048x2560x4160,2048x4096x2624 \
  --only "nv-coopmat2 f16 NT" --reps 3 > $OUT/gemm-serial.txt 2>&1; echo "gemm done at $SECONDS s"
OUT=$OUT AB_BINARIES=after AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt" timeout 90 bash bench/ab_step.sh; echo "steps done at $SECONDS s"
for f in profile-shapes profile-serial gemm-serial; do echo "== $f"; grep -E "gemm_cm2|nv-coopmat2|ms/step|rror" $OUT/$f.txt | head -16; done
