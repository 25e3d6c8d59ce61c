#!/usr/bin/env bash
# Run 21 (2026-12-06, seventh session): the fused attention kernels with two row tiles per
# workgroup (w and n - 1 - w, PAIRED; .dist/forja's default) against one (--paired 0), and the
# training step at 1x2048 against .dist/forja-before (9ee5d85's library: one tile per workgroup).
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for B in 1 8; do for p in 0 1; do
  echo "== B $B paired $p" >> $OUT/attn.txt
  timeout 30 $F bench attention --impl fused-backward --batch $B --paired $p --reps 5 2>&1 | grep -E "^fused-backward |rror" >> $OUT/attn.txt
done; done
paste - - < $OUT/attn.txt | cut -c1-150; echo "attention done at $SECONDS s"
AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt" bash bench/ab_step.sh
echo "step done at $SECONDS s"
timeout 100 .dist/forja_tests --gtest_filter='AttentionTest.Fused*:MemoryPlan.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure" $OUT/tests.txt | head -20; echo "all done at $SECONDS s"
