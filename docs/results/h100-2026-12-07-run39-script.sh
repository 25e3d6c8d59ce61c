#!/usr/bin/env bash
# Run 39 (2026-12-07): main after run 38 (dq recomputed now also with one branch per tile) and
# the kernels' DIRECT loads (FORJA_ATTENTION_DIRECT=1): the GPU tests of the fused kernels with
# and without them, the backward with dq recomputed against dq from dS, the dq kernel's
# subgroups, the forward's workgroups again after the change; the 8x2048 step.
# Carry [".gl", ".dist"]: OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
timeout 50 .dist/forja_tests --gtest_filter='AttentionTest.Fused*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
FORJA_ATTENTION_DIRECT=1 timeout 50 .dist/forja_tests --gtest_filter='AttentionTest.Fused*' > $OUT/tests-direct.txt 2>&1
echo "direct tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests-direct.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
{
  echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
  echo "== dq recomputed"; FORJA_ATTENTION_DQ_FROM_DS=0 timeout 30 .dist/forja $A 2>&1 | tail -1
  echo "== --dq-ds-warps 4"; timeout 30 .dist/forja $A --dq-ds-warps 4 2>&1 | tail -1
  echo "== --fused-forward-tiles 4,64,0"; timeout 30 .dist/forja $A --fused-forward-tiles 4,64,0 2>&1 | tail -1
  echo "== --fused-forward-tiles 8,64,1"; timeout 30 .dist/forja $A --fused-forward-tiles 8,64,1 2>&1 | tail -1
  echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
  echo "== direct"; FORJA_ATTENTION_DIRECT=1 timeout 30 .dist/forja $A 2>&1 | tail -1
  echo "== direct 4,64"; FORJA_ATTENTION_DIRECT=1 timeout 30 .dist/forja $A --fused-forward-tiles 4,64,0 2>&1 | tail -1
  echo "== --fused-forward-tiles 8,32,1"; timeout 30 .dist/forja $A --fused-forward-tiles 8,32,1 2>&1 | tail -1
  echo "== --fused-forward-tiles 4,32,1"; timeout 30 .dist/forja $A --fused-forward-tiles 4,32,1 2>&1 | tail -1
  echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
  echo "== direct"; FORJA_ATTENTION_DIRECT=1 timeout 30 .dist/forja $A 2>&1 | tail -1
  echo "== direct B4"; FORJA_ATTENTION_DIRECT=1 timeout 30 .dist/forja ${A/--reps 5/--reps 3 --batch 4} 2>&1 | tail -1
  echo "== main B4"; timeout 30 .dist/forja ${A/--reps 5/--reps 3 --batch 4} 2>&1 | tail -1
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
timeout 80 .dist/forja bench --shape qwen3-4b --peak-tflops 989 --json --batch 8 --seq-len 2048 --grad-checkpointing on \
  --steps 4 --warmup 1 2>/dev/null > $OUT/train.jsonl
python3 -c "
import json
for l in open('$OUT/train.jsonl'):
    d = json.loads(l); print(d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2), round(d['mfu'], 3))"
FORJA_ATTENTION_DIRECT=1 timeout 80 .dist/forja bench --shape qwen3-4b --peak-tflops 989 --json --batch 8 --seq-len 2048 --grad-checkpointing on \
  --steps 4 --warmup 1 2>/dev/null > $OUT/train-direct.jsonl
python3 -c "
import json
for l in open('$OUT/train-direct.jsonl'):
    d = json.loads(l); print('direct', d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2), round(d['mfu'], 3))"
echo "all done at $SECONDS s"
