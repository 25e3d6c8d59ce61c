#!/usr/bin/env bash
# Prepared for the next session, to follow prepared-2026-12-09-attn-script.sh where the ping-pong
# forward wins there (same binary, no patch needed): the training step with it
# (FORJA_ATTENTION_PINGPONG=1, "after") against without ("before"), 1x2048 and 8x2048
# (bench/ab_step.sh), the model's GPU parity tests with it on, and attention at B 1, 4, 8 both
# ways. Rename to <machine>-<date>-runNN-script.sh after it runs. Carry [".gl", ".dist"]:
# OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
FORJA_ATTENTION_PINGPONG=1 timeout 200 .dist/forja_tests --gtest_filter='ParityMixed.*:TrainStep.FoldedLora*:AttentionTest.FusedForward*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --model-inputs"
{
  for b in 1 4 8; do
    for pp in 0 1; do echo "== B $b ping-pong $pp"; timeout 60 .dist/forja $A --reps 3 --batch $b --pingpong $pp 2>&1 | tail -1; done
  done
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
AB_AFTER_ENV=FORJA_ATTENTION_PINGPONG=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt" OUT=$OUT bash bench/ab_step.sh
echo "all done at $SECONDS s"
