#!/usr/bin/env bash
# Run 27 (2026-12-07, ninth session; most of the session's device time went to calls that got no
# machine, so this one is short): the attention outputs kept across checkpointing
# (TransformerOptions::keep_attention) and the dequantisation prefetch, neither measured before:
# the GPU tests of the kept path; the 1x2048 training step with each turned off by its variable
# (one binary, alternated); a profile of the 1x2048 step with each product under its shape; the
# 8x2048 step and the peer at 1x2048 if time is left.
set -o pipefail
source bench/device_env.sh  # the Vulkan loader, the driver, the tests' inputs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
F=.dist/forja SECONDS=0
timeout 40 .dist/forja_tests --gtest_filter='TrainStep.Kept*:AttentionTest.RowDot*:MemoryPlan.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran|kept att" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
rm -f .dist/forja-before
OUT=$OUT AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt" AB_AFTER_ENV=FORJA_KEEP_ATTENTION=0 timeout 60 bash bench/ab_step.sh
mv $OUT/train.jsonl $OUT/train-keep.jsonl; echo "keep a/b done at $SECONDS s"
OUT=$OUT AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt" AB_AFTER_ENV=FORJA_DEQUANT_PREFETCH=0 timeout 60 bash bench/ab_step.sh
mv $OUT/train.jsonl $OUT/train-prefetch.jsonl; echo "prefetch a/b done at $SECONDS s"
FORJA_PROFILE=shapes timeout 40 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 > $OUT/profile-1x2048.txt 2>&1
grep -E "tokens/s|peak GPU|attention outputs kept" $OUT/profile-1x2048.txt; echo "profile done at $SECONDS s"
# the same shapes alone (the automatic tile) and through cuBLAS, against the profile's in-step figures
OUT=$OUT timeout 45 bash bench/cm2_tile_sweep.sh 2048 auto > /dev/null 2>&1; mv $OUT/cm2-tiles.txt $OUT/gemm-2048.txt
# every product under 700 tiles split in two along K (o's forward and q's backward: 320 tiles, 2.4 waves)
FORJA_SPLIT_K_NV2=700 OUT=$OUT timeout 45 bash bench/cm2_tile_sweep.sh 2048 auto > /dev/null 2>&1; mv $OUT/cm2-tiles.txt $OUT/gemm-2048-split700.txt
timeout 40 python3 bench/torch_matmul.py > $OUT/torch-matmul.txt 2>&1; echo "gemm alone done at $SECONDS s"
OUT=$OUT AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt" AB_AFTER_ENV=FORJA_SPLIT_K_NV2=700 timeout 60 bash bench/ab_step.sh
mv $OUT/train.jsonl $OUT/train-split700.jsonl; echo "split a/b done at $SECONDS s"
OUT=$OUT AB_ROUNDS=1 AB_SHAPES="8x2048:ckpt" AB_AFTER_ENV=FORJA_KEEP_ATTENTION=0 timeout 70 bash bench/ab_step.sh
mv $OUT/train.jsonl $OUT/train-keep-8x2048.jsonl; echo "8x2048 done at $SECONDS s"
OUT=$OUT AB_BINARIES=after AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt" timeout 150 bash bench/ab_step.sh .dist/hf_lora_bench.py
echo "all done at $SECONDS s"
