#!/usr/bin/env bash
# Run 27 (2026-12-07, ninth session): the attention outputs kept across checkpointing
# (TransformerOptions::keep_attention) and the dequantisation prefetch, neither measured before:
# the GPU tests of the step, the attention kernels and the memory plan; the training step with
# each turned off by its variable (one binary, alternated) and the peer in the same call; a profile of the 1x2048 step with each
# product under its shape.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 70 .dist/forja_tests --gtest_filter='TrainStep.*:ParityMixed.Qwen3Nf4:ParityMixed.FusedAttentionEmulated:Checkpointing/Parity.*:MemoryPlan.*:AttentionTest.Fused*:AttentionTest.RowDot*:BenchCli.MemoryPlanMatchesTheArenaPeak' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
rm -f .dist/forja-before
OUT=$OUT AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt" AB_AFTER_ENV=FORJA_KEEP_ATTENTION=0 timeout 330 bash bench/ab_step.sh .dist/hf_lora_bench.py
mv $OUT/train.jsonl $OUT/train-keep.jsonl; echo "keep a/b and peer done at $SECONDS s"
FORJA_PROFILE=shapes timeout 45 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 2 > $OUT/profile-1x2048.txt 2>&1
grep -E "tokens/s|peak GPU|attention outputs kept" $OUT/profile-1x2048.txt
OUT=$OUT AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt" AB_AFTER_ENV=FORJA_DEQUANT_PREFETCH=0 timeout 80 bash bench/ab_step.sh
mv $OUT/train.jsonl $OUT/train-prefetch.jsonl; echo "prefetch a/b done at $SECONDS s"
echo "all done at $SECONDS s"
