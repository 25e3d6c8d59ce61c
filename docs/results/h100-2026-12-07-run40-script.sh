#!/usr/bin/env bash
# Run 40 (2026-12-07): the forward with q's fragments from shared memory (Q_SHARED, fewer
# registers for more workgroups a multiprocessor) at several workgroups; the dq kernel's 4 and 8
# subgroups again; the dk/dv split target 512 (split 2) against 1024 (split 4) now that the
# workgroups are paired. Carry [".gl", ".dist"]: OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
timeout 60 .dist/forja_tests --gtest_filter='AttentionTest.Fused*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
{
  for round in 1 2; do
    echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
    for t in 4,32,0 4,32,0,1 4,32,1,1 2,64,0,1 2,32,0,1 4,16,0,1 8,16,0,1 4,64,0; do
      echo "== --fused-forward-tiles $t"; timeout 30 .dist/forja $A --fused-forward-tiles $t 2>&1 | tail -1
    done
    echo "== --dq-ds-warps 4"; timeout 30 .dist/forja $A --dq-ds-warps 4 2>&1 | tail -1
    echo "== --dkv-split-target 512"; timeout 30 .dist/forja $A --dkv-split-target 512 2>&1 | tail -1
  done
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "all done at $SECONDS s"
