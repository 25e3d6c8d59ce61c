#!/usr/bin/env bash
# Prepared for the next session (the seventeenth's device time went on failed starts and one
# call that measured nothing, run 45): build main with prepared-dq-no-k-prefetch.patch applied
# (git apply; variant flash_bwd_dq_ds_quad_nokp_khr, FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1: dq 2 x 2
# with K staged after the barrier instead of prefetched into registers, 32 registers fewer), then
# bash bench/prepare_dist.sh; rename to <machine>-<date>-runNN-script.sh after it runs. One
# binary: attention at B 1 (two rounds) and B 4 for main, the forward's ping-pong schedule
# (--pingpong 1) and no-K-prefetch, registers, then the fused kernels' GPU tests
# (FusedForwardMatchesReference runs the ping-pong in modes 3 and 4, never yet on a device;
# FusedBackward runs d71421b's dq block for the first time there). Timings first, in case the
# call is cut short. Carry [".gl", ".dist"]: OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --model-inputs"
{
  for round in 1 2; do
    echo "== main"; timeout 30 .dist/forja $A --reps 5 2>&1 | tail -1
    echo "== ping-pong"; timeout 30 .dist/forja $A --reps 5 --pingpong 1 2>&1 | tail -1
    echo "== no K prefetch"; FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 timeout 30 .dist/forja $A --reps 5 2>&1 | tail -1
  done
  echo "== ping-pong 8,32"; timeout 30 .dist/forja $A --reps 5 --pingpong 1 --fused-forward-tiles 8,32,0 2>&1 | tail -1
  echo "== main B4"; timeout 40 .dist/forja $A --reps 3 --batch 4 2>&1 | tail -1
  echo "== ping-pong B4"; timeout 40 .dist/forja $A --reps 3 --batch 4 --pingpong 1 2>&1 | tail -1
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
FORJA_PIPELINE_STATS=1 timeout 40 .dist/forja $A --reps 1 --pingpong 1 > $OUT/stats-pp.txt 2>&1
FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 FORJA_PIPELINE_STATS=1 timeout 40 .dist/forja $A --reps 1 > $OUT/stats-nokp.txt 2>&1
for f in stats-pp stats-nokp; do echo "== $f"; grep -E "Register Count" $OUT/$f.txt | sed 's/Binary Size.*//' | cut -c1-200; done
timeout 120 .dist/forja_tests --gtest_filter='AttentionTest.FusedForwardMatches*:AttentionTest.FusedBackward*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
echo "all done at $SECONDS s"
