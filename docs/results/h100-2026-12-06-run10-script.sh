#!/usr/bin/env bash
# Run 10 (2026-12-06, fourth session): .dist/forja at de5076c (q/k norm + RoPE + fp16 in one
# pass), .dist/forja-before at 8bb3cde (the commit before it); ab_step.sh alternates them twice.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
timeout 150 .dist/forja_tests --gtest_filter='RopeTest.*:AttentionTest.*:ElementwiseTest.*:NormTest.*:ParityMixed.Qwen3Nf4:ParityMixed.Qwen3Nf4Fused:ParityMixed.Qwen3Nf4FlashAttentionCheckpointing:ParityMixed.Qwen3DropoutCheckpointing:ParityMixed.ForwardRange*:TrainStep.*:BenchCli.*:Parity.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
for bin in .dist/forja-before $F; do
  echo "== $bin" >> $OUT/attn.txt
  timeout 60 $bin bench attention --impl fused-backward --reps 5 >> $OUT/attn.txt 2>&1
  timeout 60 $bin bench attention --impl fused-backward --batch 8 --reps 3 >> $OUT/attn.txt 2>&1
done
grep -E "^==|^fused" $OUT/attn.txt
FORJA_PROFILE=1 timeout 90 $F bench --shape qwen3-4b --peak-tflops 989 --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 > $OUT/profile-8x2048.txt 2>&1
head -40 $OUT/profile-8x2048.txt | tail -33; echo "profile done at $SECONDS s"
AB_SHAPES="8x2048:ckpt 1x2048:ckpt 4x512" bash bench/ab_step.sh .dist/hf_lora_bench.py
echo "all done at $SECONDS s"
