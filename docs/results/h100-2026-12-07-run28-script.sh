#!/usr/bin/env bash
# Run 28 (2026-12-07, tenth session): the LoRA inputs kept across checkpointing
# (TransformerOptions::keep_lora_inputs), not measured before: its GPU tests; the 1x2048 and
# 8x2048 steps with and without FORJA_KEEP_LORA_INPUTS=0 (one binary, alternated); then issue
# 14's bars with the same-call peer (1x2048, 8x2048 checkpointing, 4x512) and attention alone;
# a FORJA_PROFILE=serial profile of 1x2048 (each op alone: its own time) and the SM clock and
# power sampled every 200 ms throughout (nvidia-smi), against run 27's products running 8-62%
# slower in the step than alone.
# At most 8 files under $OUT (the device tool brings back no more).
set -o pipefail
source bench/device_env.sh  # the Vulkan loader, the driver, the tests' inputs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
F=.dist/forja SECONDS=0
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 200 > $OUT/clocks.txt 2>&1 &
timeout 40 .dist/forja_tests --gtest_filter='TrainStep.Kept*:MemoryPlan.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|kept att" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
OUT=$OUT AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt" AB_AFTER_ENV=FORJA_KEEP_LORA_INPUTS=0 timeout 120 bash bench/ab_step.sh
echo "keep-t a/b done at $SECONDS s (before: kept, after: FORJA_KEEP_LORA_INPUTS=0)"
for B in 1 8; do
  timeout 40 $F bench attention --impl fused-backward --batch $B --reps 5 2>&1 | grep -E "^fused-backward |rror" >> $OUT/attn.txt
done
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
echo "== profile start $(date +%T.%N)" >> $OUT/clocks.txt
FORJA_PROFILE=serial timeout 40 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 > $OUT/profile.txt 2>&1
echo "== profile end $(date +%T.%N)" >> $OUT/clocks.txt
grep -E "tokens/s|ms/step" $OUT/profile.txt; echo "profile done at $SECONDS s"
OUT=$OUT AB_BINARIES=after AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" timeout 330 bash bench/ab_step.sh .dist/hf_lora_bench.py
kill %1 2>/dev/null; echo "all done at $SECONDS s"
