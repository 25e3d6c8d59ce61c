#!/usr/bin/env bash
# Run 18 (2026-12-06, sixth session, on run 17's warm machine): the GPU suites of .dist/forja_tests
# at 19a01c3 within the 230 s left; it timed out in GemmTest.NvCoopmat2BitExactAndRandom after 67
# tests passed and none failed.
source bench/device_env.sh; export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja; timeout 230 .dist/forja_tests --gtest_filter='GemmTest.*:Nf4GpuTest.*:AttentionTest.*:FlashAttentionTest.*:NormTest.*:RopeTest.*:ElementwiseTest.*:CrossEntropyTest.*:EmbeddingTest.*:CachedAttentionTest.*:DropoutTest.*:AdamW*.*:ParityMixed.*:Parity*.*:*Parity.*:TrainStep.*:MemoryPlan.*:DropoutEngine.*:Memorisation.*' > $OUT/tests-gpu.txt 2>&1; echo rc $?; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran|SKIPPED \]" $OUT/tests-gpu.txt | head -30
