#!/usr/bin/env bash
# Run 23 (2026-12-06, eighth session): issue 14's step bars on an H200 with the same-call peer:
# forja (main after run 22's fix, paired row tiles through FORJA_ATTENTION_PAIRED=1) and
# transformers + PEFT (../shared/peer/hf_lora_bench.py), Qwen3-4B 1x2048 and 8x2048 with
# checkpointing, 4x512 without.
source bench/device_env.sh >/dev/null 2>&1; nvidia-smi --query-gpu=name --format=csv,noheader; SECONDS=0; OUT=$OUT AB_BINARIES=after AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" AB_AFTER_ENV=FORJA_ATTENTION_PAIRED=1 timeout 520 bash bench/ab_step.sh .dist/hf_lora_bench.py 2>&1 | tee $OUT/log.txt; echo "done at $SECONDS s"
