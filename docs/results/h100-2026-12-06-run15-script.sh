#!/usr/bin/env bash
# Run 15 (2026-12-06, sixth session): .dist/forja (forward loop fix, nf4 runs, one dequantised
# slot per projection kind reused by the checkpointed backward) against .dist/forja-before
# (37ed3c1, run 14's binary), the peer in the same call.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 .dist/forja_tests --gtest_filter='Nf4GpuTest.Dequantize*:ParityMixed.*:AttentionTest.Fused*:TrainStep.*:MemoryPlan.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
for B in 1 8; do for t in before:8,64,0 after:8,64,0 after:8,64,1; do
  f=.dist/forja; [ ${t%%:*} = before ] && f=.dist/forja-before
  echo "== B $B ${t%%:*} tiles ${t#*:}" >> $OUT/attn.txt
  timeout 20 $f bench attention --impl fused-backward --batch $B --fused-forward-tiles ${t#*:} --reps 5 2>&1 | grep -E "^fused-backward " >> $OUT/attn.txt
done; done
paste - - < $OUT/attn.txt | cut -c1-120; echo "attention done at $SECONDS s"
for l in runs strided words; do
  FORJA_NF4_DEQUANT=$l FORJA_PROFILE=1 timeout 40 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 2 > $OUT/profile-1x2048-$l.txt 2>&1
  echo "$l: $(grep -E 'nf4_dequantize|attention_fused_forward' $OUT/profile-1x2048-$l.txt | tr -s ' ' | tr '\n' ' ') $(grep 'tokens/s' $OUT/profile-1x2048-$l.txt)"
done
echo "profiles done at $SECONDS s"
AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" bash bench/ab_step.sh .dist/hf_lora_bench.py
echo "all done at $SECONDS s"
