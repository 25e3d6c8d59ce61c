#!/usr/bin/env bash
# Run 16 (2026-12-06, sixth session): .dist/forja at 19a01c3 (the forward's counted loop again,
# dequantised slots per projection kind, nf4 four words strided) against .dist/forja-before
# (37ed3c1, run 14's binary).
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 .dist/forja_tests --gtest_filter='Nf4GpuTest.Dequantize*:ParityMixed.*:AttentionTest.Fused*:TrainStep.*:MemoryPlan.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
for B in 1 8; do for t in 8,64,0 8,64,1; do
  echo "== B $B tiles $t" >> $OUT/attn.txt
  timeout 20 $F bench attention --impl fused-backward --batch $B --fused-forward-tiles $t --reps 5 2>&1 | grep -E "^fused-backward " >> $OUT/attn.txt
done; done
paste - - < $OUT/attn.txt | cut -c1-120; echo "attention done at $SECONDS s"
FORJA_PROFILE=1 timeout 40 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 2 > $OUT/profile-1x2048.txt 2>&1
grep -E "nf4_dequantize|attention_fused_forward|to_f16_block|tokens/s|peak GPU|memory plan" $OUT/profile-1x2048.txt
echo "profile done at $SECONDS s"
AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" bash bench/ab_step.sh
echo "all done at $SECONDS s"
