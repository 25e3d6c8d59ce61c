#!/usr/bin/env bash
# Prepared for a later session (not yet run: the sixteenth session's device time ran out): build
# main with prepared-2026-12-08-run45-dq-no-k-prefetch.patch applied (git apply), then bash
# bench/prepare_dist.sh; rename to <machine>-<date>-runNN-script.sh after it runs.
# Run 45: dq from dS 2 x 2 with K staged after the barrier instead
# of prefetched into registers (FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1: 32 registers fewer, for a
# third workgroup a multiprocessor) against main, in one binary: the fused backward's GPU test
# with it, registers, attention at B 1 and 4. Carry [".gl", ".dist"]: OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 timeout 200 .dist/forja_tests --gtest_filter='AttentionTest.FusedBackward*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 FORJA_PIPELINE_STATS=1 timeout 40 .dist/forja $A > $OUT/stats.txt 2>&1
grep -E "flash_bwd_dq" $OUT/stats.txt | sed 's/Binary Size.*//' | cut -c1-160
{
  for round in 1 2; do
    echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
    echo "== no K prefetch"; FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 timeout 30 .dist/forja $A 2>&1 | tail -1
  done
  echo "== main B4"; timeout 40 .dist/forja ${A/--reps 5/--reps 3 --batch 4} 2>&1 | tail -1
  echo "== no K prefetch B4"; FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 timeout 40 .dist/forja ${A/--reps 5/--reps 3 --batch 4} 2>&1 | tail -1
  echo "== no K prefetch, serial profile"
  FORJA_EXPERIMENT_DQ_NO_K_PREFETCH=1 FORJA_PROFILE=serial timeout 40 .dist/forja $A 2>&1 | grep -v "^forja: pipeline" | grep -A4 "GPU profile"
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "all done at $SECONDS s"
