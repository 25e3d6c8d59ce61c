#!/usr/bin/env bash
# Run 45 (seventeenth session) as it ran: main 607bdd0 (the forward's ping-pong schedule, off by
# default) plus prepared-2026-12-08-run45-dq-no-k-prefetch.patch, one binary. It ran on an H100
# and measured nothing: 607bdd0's shared-memory check refused the forward's own 8,64 tiles on
# NVIDIA (fixed in 5c1dc02, with a test); see docs/benchmarks.md. Carry [".gl", ".dist"].
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
timeout 200 .dist/forja_tests --gtest_filter='AttentionTest.FusedForwardMatches*:AttentionTest.FusedBackward*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 timeout 200 .dist/forja_tests --gtest_filter='AttentionTest.FusedBackward*' > $OUT/tests-nokp.txt 2>&1
echo "tests nokp rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests-nokp.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --model-inputs"
FORJA_PIPELINE_STATS=1 timeout 40 .dist/forja $A --reps 3 > $OUT/stats.txt 2>&1
FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 FORJA_PIPELINE_STATS=1 timeout 40 .dist/forja $A --reps 3 > $OUT/stats-nokp.txt 2>&1
FORJA_PIPELINE_STATS=1 timeout 40 .dist/forja $A --reps 3 --pingpong 1 > $OUT/stats-pp.txt 2>&1
for f in stats stats-nokp stats-pp; do echo "== $f"; grep -E "Register Count" $OUT/$f.txt | sed 's/Binary Size.*//' | cut -c1-200; done
{
  for round in 1 2; do
    echo "== main"; timeout 30 .dist/forja $A --reps 5 2>&1 | tail -1
    echo "== no K prefetch"; FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 timeout 30 .dist/forja $A --reps 5 2>&1 | tail -1
    echo "== ping-pong"; timeout 30 .dist/forja $A --reps 5 --pingpong 1 2>&1 | tail -1
  done
  echo "== ping-pong 8,32"; timeout 30 .dist/forja $A --reps 5 --pingpong 1 --fused-forward-tiles 8,32,0 2>&1 | tail -1
  echo "== main B4"; timeout 40 .dist/forja $A --reps 3 --batch 4 2>&1 | tail -1
  echo "== ping-pong B4"; timeout 40 .dist/forja $A --reps 3 --batch 4 --pingpong 1 2>&1 | tail -1
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "all done at $SECONDS s"
