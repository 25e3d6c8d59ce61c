#!/usr/bin/env bash
# Binary: main ed00153 (the ROW_FRAGS commits, reverted after this run: every two-fragment tile was slower).
# Run 21 (2026-12-06, eighth session): the fused attention's paired row tiles and the forward's two
# query fragments per subgroup (--fused-forward-tiles W,K,P,ROW_FRAGS), measured; their tests on
# the real kernels.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 .dist/forja_tests --gtest_filter='AttentionTest.Fused*:MemoryPlan.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran|Failure" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
cfgs=("" "--paired 1" "--fused-forward-tiles 4,16,0,2" "--fused-forward-tiles 4,32,0,2" "--fused-forward-tiles 2,32,0,2"
      "--fused-forward-tiles 8,16,0,2" "--fused-forward-tiles 8,32,0,2" "--fused-forward-tiles 8,64,0,2"
      "--fused-forward-tiles 4,64,0,2" "--fused-forward-tiles 4,16,0,2 --paired 1" "--fused-forward-tiles 8,32,0,2 --paired 1")
for B in 1 8; do for c in "${cfgs[@]}"; do
  echo "== B $B $c" >> $OUT/attn.txt; echo "== B $B $c" >> $OUT/stats.txt
  FORJA_PIPELINE_STATS=1 timeout 40 $F bench attention --impl fused-backward --batch $B $c --reps 5 \
    2>>$OUT/stats.txt | grep -E "^fused-backward |rror" >> $OUT/attn.txt
done; done
paste - - < $OUT/attn.txt | cut -c1-170; echo "attention done at $SECONDS s"
grep -E "flash_fwd" $OUT/stats.txt | sort -u | sed 's/Binary Size=[0-9]*; Stack Size=0; Local Memory Size=[0-9]*; //' | cut -c1-200
grep -iE "error|fail" $OUT/stats.txt | sort -u | head
echo "all done at $SECONDS s"
