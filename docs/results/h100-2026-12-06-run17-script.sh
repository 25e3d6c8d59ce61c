#!/usr/bin/env bash
# Run 17 (2026-12-06, sixth session): .dist/forja at 19a01c3 (run 16's binary) against
# .dist/forja-before (37ed3c1, run 14's) at three shapes, one round, and the peer in the same
# call; an 8x2048 profile; the thin products' split target at 1x2048 (FORJA_SPLIT_K_THIN).
set -o pipefail
source bench/device_env.sh
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" bash bench/ab_step.sh .dist/hf_lora_bench.py
echo "step and peer done at $SECONDS s"
FORJA_PROFILE=1 timeout 60 $F bench --shape qwen3-4b --peak-tflops 989 --batch 8 --seq-len 2048 --grad-checkpointing on --steps 2 --warmup 1 > $OUT/profile-8x2048.txt 2>&1
grep -E "tokens/s|peak GPU|memory plan" $OUT/profile-8x2048.txt
for t in 256 512 2048; do
  echo "thin split target $t: $(FORJA_SPLIT_K_THIN=$t timeout 60 $F bench --shape qwen3-4b --peak-tflops 989 --json --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2 2>/dev/null | tee -a $OUT/thin-split.jsonl | python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read())["tokens_per_s"]))')"
done
echo "all done at $SECONDS s"
