#!/usr/bin/env bash
# Binary: main b10392f + the kept-loop fix of the paired kernels (committed after this run).
# Run 22 (2026-12-06, eighth session): paired row tiles with the two tiles in a kept loop (one copy
# of the tile's body); their tests on the real kernels; attention alone; the training step with
# and without FORJA_ATTENTION_PAIRED=1 (one binary, alternated).
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 .dist/forja_tests --gtest_filter='AttentionTest.Fused*:MemoryPlan.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
for B in 1 8; do for p in 0 1; do
  echo "== B $B paired $p" >> $OUT/attn.txt; echo "== B $B paired $p" >> $OUT/stats.txt
  FORJA_PIPELINE_STATS=1 timeout 40 $F bench attention --impl fused-backward --batch $B --paired $p --reps 5 \
    2>>$OUT/stats.txt | grep -E "^fused-backward |rror" >> $OUT/attn.txt
done; done
paste - - < $OUT/attn.txt | cut -c1-170; echo "attention done at $SECONDS s"
grep -E "flash_" $OUT/stats.txt | sort -u | sed 's/Binary Size=[0-9]*; Stack Size=0; Local Memory Size=[0-9]*; //' | cut -c1-200
rm -f .dist/forja-before
OUT=$OUT AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt" AB_AFTER_ENV=FORJA_ATTENTION_PAIRED=1 timeout 300 bash bench/ab_step.sh
cp $OUT/train.jsonl $OUT/train-ab.jsonl 2>/dev/null
echo "all done at $SECONDS s"
