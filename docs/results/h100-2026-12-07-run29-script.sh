#!/usr/bin/env bash
# Run 29 (eleventh session, 2026-12-07): the fixed profiler's profile of the 1x2048 step serially
# (each op alone) and by shape; the fused attention forward's prefetches (0 staged, 1 k and v of
# the next tile in registers, 2 k and v in turn: new); the step A/B: .dist/forja-before =
# 5465fd5 (main at the session's start) against .dist/forja (q/k/v and gate/up side by side in
# the fold columns, so a group's products run together), then prefetch 2 in the step; the GPU
# tests of the changes. After `bash bench/prepare_dist.sh` and the baseline copied to
# .dist/forja-before, carry [".gl", ".dist"]: OUT=$OUT bash <this script>
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
F=.dist/forja SECONDS=0
B="bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1"
FORJA_PROFILE=serial timeout 60 $F $B > $OUT/profile-serial.txt 2>&1; echo "serial done at $SECONDS s"
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5"
for b in 1 8; do for t in 8,64,0 8,64,1 8,64,2 4,64,2 8,32,2; do
  echo "== B $b tiles $t"; timeout 40 $F $A --batch $b --fused-forward-tiles $t 2>&1 | tail -3
done; done > $OUT/attn.txt 2>&1; echo "attention done at $SECONDS s"
OUT=$OUT AB_ROUNDS=2 AB_SHAPES="1x2048:ckpt 8x2048:ckpt" timeout 300 bash bench/ab_step.sh; echo "steps done at $SECONDS s"
for p in 2 0; do FORJA_ATTENTION_PREFETCH=$p timeout 60 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 \
  --grad-checkpointing on --json 2>/dev/null | sed "s/^{/{\"prefetch\":$p,/" >> $OUT/prefetch-step.jsonl; done
echo "prefetch steps done at $SECONDS s"; cat $OUT/prefetch-step.jsonl | cut -c1-200
FORJA_PARITY_DIR=$PWD/.dist/parity timeout 150 .dist/forja_tests --gtest_filter='AttentionTest.Fused*:ParityMixed.*:TrainStep.*:*ToF16Block*:*BlockBesideW*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head
FORJA_PROFILE=shapes timeout 60 $F $B > $OUT/profile-shapes.txt 2>&1; echo "shapes done at $SECONDS s"
cat $OUT/attn.txt
for f in profile-serial profile-shapes; do echo "== $f"; grep -E "ms/step" $OUT/$f.txt; sed -n '/total ms/,+40p' $OUT/$f.txt; done
