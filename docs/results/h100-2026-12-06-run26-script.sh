#!/usr/bin/env bash
# Run 26 (2026-12-06, eighth session): main 3f5df63 (paired row tiles on by default) on an H100,
# issue 14's step bars with the same-call peer (../shared/peer/hf_lora_bench.py).
source bench/device_env.sh >/dev/null 2>&1; nvidia-smi --query-gpu=name --format=csv,noheader; SECONDS=0; OUT=$OUT AB_BINARIES=after AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" timeout 300 bash bench/ab_step.sh .dist/hf_lora_bench.py 2>&1 | tee $OUT/log.txt; echo "done at $SECONDS s"
