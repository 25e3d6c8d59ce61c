#!/usr/bin/env bash
# Run 30 (eleventh session, 2026-12-07): what each kind of op costs the 1x2048 step at full
# overlap (FORJA_SKIP_OPS leaves its dispatches out; the profiler's timestamps serialize the step,
# 331 ms profiled against 285 in run 29), then issue 14's bars with the same-call peer (main with
# the q/k/v and gate/up products side by side). Carry [".gl", ".dist"]: OUT=$OUT bash <this script>
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
F=.dist/forja SECONDS=0
B="bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 2 --warmup 1 --json"
for skip in "" attention_ lora_ gemm_cm2 nf4_dequantize gemm_split_k to_f16_block ew_swiglu,rmsnorm,qk_norm_rope,rope_backward,ew_to_f16 ce_,adamw,sumsq,sqrt_sum ""; do
  FORJA_SKIP_OPS=$skip timeout 30 $F $B 2>/dev/null | sed "s/^{/{\"skip\":\"$skip\",/" >> $OUT/skip.jsonl
  tail -1 $OUT/skip.jsonl | cut -c1-60; echo " ... $(tail -1 $OUT/skip.jsonl | grep -o '"step_ms":[0-9.]*')"
done
echo "skips done at $SECONDS s"
OUT=$OUT AB_BINARIES=after AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" timeout 300 bash bench/ab_step.sh .dist/hf_lora_bench.py
echo "all done at $SECONDS s"
