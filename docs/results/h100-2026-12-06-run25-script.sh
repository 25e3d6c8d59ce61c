#!/usr/bin/env bash
# Run 25 (2026-12-06, eighth session): main 3f5df63 on an H100, the step's GPU tests that run 24's
# time limit cut off.
source bench/device_env.sh; export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; SECONDS=0; timeout 170 .dist/forja_tests --gtest_filter='TrainStep.*:ParityMixed.*:Parity.*:Nf4GpuTest.Dequantize*' > $OUT/tests.txt 2>&1; echo rc $?; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head; echo "done at $SECONDS s"
