#!/usr/bin/env bash
# Run 43 (2026-12-07, sixteenth session): dq from dS by subgroups 2 x 2 (--dq-ds-quad,
# FORJA_ATTENTION_DQ_DS_QUAD) against main's layout, in one binary: the GPU tests of the fused
# kernels, registers, attention at B 1, 4, 8, serial profiles, the 1x2048 step. Carry [".gl",
# ".dist"]: OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
timeout 200 .dist/forja_tests --gtest_filter='AttentionTest.Fused*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
{
  echo "== registers"
  FORJA_PIPELINE_STATS=1 timeout 30 .dist/forja $A --reps 1 --dq-ds-quad 1 2>&1 | grep "^forja: pipeline flash" | cut -c1-200
  FORJA_PIPELINE_STATS=1 timeout 30 .dist/forja $A --reps 1 --dq-ds-quad 1 --dq-ds-warps 8 2>&1 | grep "^forja: pipeline flash_bwd_dq" | cut -c1-200
  for round in 1 2; do
    echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
    echo "== quad"; timeout 30 .dist/forja $A --dq-ds-quad 1 2>&1 | tail -1
    echo "== quad, 8 subgroups"; timeout 30 .dist/forja $A --dq-ds-quad 1 --dq-ds-warps 8 2>&1 | tail -1
    echo "== quad, 2 subgroups"; timeout 30 .dist/forja $A --dq-ds-quad 1 --dq-ds-warps 2 2>&1 | tail -1
  done
  for b in 4 8; do
    echo "== main B$b"; timeout 40 .dist/forja ${A/--reps 5/--reps 3 --batch $b} 2>&1 | tail -1
    echo "== quad B$b"; timeout 40 .dist/forja ${A/--reps 5/--reps 3 --batch $b} --dq-ds-quad 1 2>&1 | tail -1
  done
  echo "== main, serial profile"
  FORJA_PROFILE=serial timeout 40 .dist/forja $A 2>&1 | grep -v "^forja: pipeline" | grep -A8 "GPU profile"
  echo "== quad, serial profile"
  FORJA_PROFILE=serial timeout 40 .dist/forja $A --dq-ds-quad 1 2>&1 | grep -v "^forja: pipeline" | grep -A8 "GPU profile"
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
for quad in 0 1 0 1; do
  FORJA_ATTENTION_DQ_DS_QUAD=$quad timeout 80 .dist/forja bench --shape qwen3-4b --peak-tflops 989 --json --batch 1 \
    --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 1 2>/dev/null | sed "s/^{/{\"dq_ds_quad\": $quad, /" >> $OUT/train.jsonl
done
python3 -c "
import json
for l in open('$OUT/train.jsonl'):
    d = json.loads(l); print(d['dq_ds_quad'], d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2), round(d['mfu'], 3))"
echo "all done at $SECONDS s"
