#!/usr/bin/env bash
# Run 24 (2026-12-06, eighth session; asked for any card, got an H100): main 3f5df63 (paired row tiles on by default) on an H200:
# the GPU tests of the kernels and the step; profiles of the 1x2048 and 8x2048 steps.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 .dist/forja_tests --gtest_filter='Nf4GpuTest.*:ParityMixed.*:Parity.*:AttentionTest.*:TrainStep.*:MemoryPlan.*:GemmTest.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
FORJA_PROFILE=1 timeout 60 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 2 > $OUT/profile-1x2048.txt 2>&1
FORJA_PROFILE=1 timeout 90 $F bench --shape qwen3-4b --peak-tflops 989 --batch 8 --seq-len 2048 --grad-checkpointing on --steps 2 --warmup 1 > $OUT/profile-8x2048.txt 2>&1
grep -E "gemm_cm2|attention_fused|nf4_dequantize|to_f16_block|tokens/s|peak GPU|memory plan " $OUT/profile-*.txt
echo "all done at $SECONDS s"
