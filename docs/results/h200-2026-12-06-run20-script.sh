#!/usr/bin/env bash
# Run 20 (2026-12-06, seventh session): attention forward and backward on NV cooperative matrix 2
# (kernels/flash_forward_cm2.comp, flash_backward_cm2.comp: `--fused-forward-cm2 THREADS,ROWS,KEYS`,
# `--fused-backward-cm2 THREADS,DQ_ROWS,DQ_KEYS,KV_ROWS,KV_QUERIES`) against the KHR kernels; the
# tests of both; the compiler's statistics of each tile.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 .dist/forja_tests --gtest_filter='AttentionTest.Fused*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran|Failure" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
fwd=(khr 128,64,64 128,64,32 256,128,64 256,64,64 128,128,64 128,64,128 64,64,64 256,128,128 128,32,64)
bwd=(khr 128,64,64,64,64 128,64,32,64,32 256,128,64,128,64 256,64,64,64,64 128,128,64,128,64 128,64,128,64,128 64,64,64,64,64 128,32,64,32,64 256,64,128,64,128)
for B in 1 8; do for i in "${!fwd[@]}"; do
  opt=(); [ "${fwd[$i]}" != khr ] && opt=(--fused-forward-cm2 ${fwd[$i]} --fused-backward-cm2 ${bwd[$i]})
  echo "== B $B fwd ${fwd[$i]} bwd ${bwd[$i]}" >> $OUT/attn.txt; echo "== B $B ${fwd[$i]} ${bwd[$i]}" >> $OUT/stats.txt
  FORJA_PIPELINE_STATS=1 timeout 40 $F bench attention --impl fused-backward --batch $B "${opt[@]}" --reps 5 \
    2>>$OUT/stats.txt | grep -E "^fused-backward |rror" >> $OUT/attn.txt
done; done
paste - - < $OUT/attn.txt | cut -c1-150; echo "attention done at $SECONDS s"
grep -E "_cm2" $OUT/stats.txt | sort -u | sed 's/Binary Size=[0-9]*; Stack Size=0; Local Memory Size=[0-9]*; //' | cut -c1-200
grep -iE "error|fail" $OUT/stats.txt | sort -u | head
echo "all done at $SECONDS s"
