#!/usr/bin/env bash
# Prepared in the twelfth session (2026-12-07), not run (the session's device time ran out):
# gemm_split_k with sixteen slices' loads in flight per invocation (the branch
# experiment/split-k-sum-loads: "after", .dist/forja) against main ("before",
# .dist/forja-before), the 1x2048 step alternated, after the split-K tests on the GPU. Build the
# branch, `bash bench/prepare_dist.sh`, copy main's stripped forja to .dist/forja-before, then
# carry [".gl", ".dist"]: OUT=$OUT bash <this script>
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
timeout 30 .dist/forja_tests --gtest_filter='GemmTest.SplitK*:GemmTest.Fp16*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -4; echo "tests done at $SECONDS s"
OUT=$OUT AB_SHAPES="1x2048:ckpt" AB_ROUNDS=2 timeout 100 bash bench/ab_step.sh
echo "all done at $SECONDS s"
