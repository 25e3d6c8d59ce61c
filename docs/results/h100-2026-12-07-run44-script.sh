#!/usr/bin/env bash
# Run 44 (2026-12-07, sixteenth session): main with dq from dS by subgroups 2 x 2 on by default
# and attention_row_dot's sums by subgroup adds: the GPU tests of the fused kernels, the row dot,
# the parity and the folded training steps; the kernels' registers; attention at B 1 against
# FORJA_ATTENTION_DQ_DS_QUAD=0, its serial profile; the 8x2048 step. Carry
# [".gl", ".dist"]: OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
timeout 200 .dist/forja_tests --gtest_filter='AttentionTest.Fused*:AttentionTest.RowDot*:ParityMixed.*:TrainStep.FoldedLora*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
FORJA_PIPELINE_STATS=1 timeout 40 .dist/forja $A > $OUT/stats.txt 2>&1
echo "stats rc $?: $(wc -l < $OUT/stats.txt) lines"; grep -E "flash_(bwd|fwd)" $OUT/stats.txt | sed 's/Binary Size.*//' | cut -c1-160
{
  for round in 1 2; do
    echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
    echo "== FORJA_ATTENTION_DQ_DS_QUAD=0"; FORJA_ATTENTION_DQ_DS_QUAD=0 timeout 30 .dist/forja $A 2>&1 | tail -1
  done
  echo "== main, serial profile"
  FORJA_PROFILE=serial timeout 40 .dist/forja $A 2>&1 | grep -v "^forja: pipeline" | grep -A8 "GPU profile"
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
timeout 150 .dist/forja bench --shape qwen3-4b --peak-tflops 989 --json --batch 8 --seq-len 2048 --grad-checkpointing on \
  --steps 4 --warmup 1 2>/dev/null >> $OUT/train.jsonl
python3 -c "
import json
for l in open('$OUT/train.jsonl'):
    d = json.loads(l); print(d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2), round(d['mfu'], 3))"
echo "all done at $SECONDS s"
