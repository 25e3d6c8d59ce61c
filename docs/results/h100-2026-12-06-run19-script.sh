#!/usr/bin/env bash
# Run 19 (2026-12-06, seventh session): the fused attention kernels' tiles read directly from their
# buffers (DIRECT) against staged in shared memory; the compiler's statistics of each pipeline
# (FORJA_PIPELINE_STATS=1: registers per invocation).
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 .dist/forja_tests --gtest_filter='AttentionTest.Fused*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
fwd=(8,64,0,0 8,64,0,1 4,64,0,1 4,32,0,1 8,32,0,1 2,64,0,1 8,16,0,1 4,64,0,0)
bwd=(4,64,4,32,0,0 4,64,4,32,1,1 4,64,4,32,1,0 4,64,4,32,0,1 8,64,8,32,1,1 2,64,2,32,1,1 4,32,4,16,1,1 8,32,2,32,1,1)
for B in 1 8; do for i in "${!fwd[@]}"; do
  echo "== B $B fwd ${fwd[$i]} bwd ${bwd[$i]}" >> $OUT/attn.txt
  echo "== B $B fwd ${fwd[$i]} bwd ${bwd[$i]}" >> $OUT/stats-attn.txt
  FORJA_PIPELINE_STATS=1 timeout 30 $F bench attention --impl fused-backward --batch $B --fused-forward-tiles ${fwd[$i]} \
    --fused-backward-tiles ${bwd[$i]} --reps 5 2>>$OUT/stats-attn.txt | grep -E "^fused-backward |rror" >> $OUT/attn.txt
done; done
paste - - < $OUT/attn.txt | cut -c1-150; echo "attention done at $SECONDS s"
grep -E "flash_(fwd|bwd)" $OUT/stats-attn.txt | sort -u | cut -c1-300 | head -40
FORJA_PIPELINE_STATS=1 timeout 60 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 2 --warmup 1 > $OUT/step-stats.txt 2>&1
grep -c "forja: pipeline" $OUT/step-stats.txt; grep -E "tokens/s" $OUT/step-stats.txt | head -3
echo "all done at $SECONDS s"
