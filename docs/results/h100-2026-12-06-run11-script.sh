#!/usr/bin/env bash
# Run 1 (2026-12-06, fifth session): .dist/forja at 1249098+ (norms' fp16 outputs; heavy query
# tiles first; --fused-forward-tiles), .dist/forja-before at de5076c.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 .dist/forja_tests --gtest_filter='NormTest.*:AttentionTest.*:ParityMixed.*:TrainStep.*:BenchCli.*:Parity.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
for bin in .dist/forja-before $F; do
  echo "== $bin" >> $OUT/attn.txt
  timeout 60 $bin bench attention --impl fused-backward --reps 5 >> $OUT/attn.txt 2>&1
  timeout 60 $bin bench attention --impl fused-backward --batch 8 --reps 3 >> $OUT/attn.txt 2>&1
done
for t in 8,64 4,64 8,32 4,32 2,64 8,16; do
  echo "== tiles $t" >> $OUT/attn.txt
  timeout 60 $F bench attention --impl fused-backward --fused-forward-tiles $t --reps 5 >> $OUT/attn.txt 2>&1
done
grep -E "^==|^fused" $OUT/attn.txt; echo "attention done at $SECONDS s"
FORJA_PROFILE=1 timeout 90 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 2 > $OUT/profile-1x2048.txt 2>&1
head -42 $OUT/profile-1x2048.txt | tail -32; echo "profile done at $SECONDS s"
AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" bash bench/ab_step.sh .dist/hf_lora_bench.py
echo "all done at $SECONDS s"
