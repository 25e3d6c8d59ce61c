#!/usr/bin/env bash
# Run 41 (2026-12-07): main with dq from dS on 4 subgroups by default: the GPU tests of the fused
# kernels, the parity and the folded training steps; attention at B 1 and 4 against 8 subgroups, B 8;
# the 1x2048 step. Carry [".gl", ".dist"]: OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
FORJA_PARITY_DIR=$PWD/.dist/parity timeout 150 .dist/forja_tests \
  --gtest_filter='AttentionTest.Fused*:ParityMixed.*:TrainStep.FoldedLora*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
{
  for round in 1 2; do
    echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
    echo "== --dq-ds-warps 8"; timeout 30 .dist/forja $A --dq-ds-warps 8 2>&1 | tail -1
  done
  echo "== main B4"; timeout 30 .dist/forja ${A/--reps 5/--reps 3 --batch 4} 2>&1 | tail -1
  echo "== --dq-ds-warps 8 B4"; timeout 30 .dist/forja ${A/--reps 5/--reps 3 --batch 4} --dq-ds-warps 8 2>&1 | tail -1
  echo "== main B8"; timeout 40 .dist/forja ${A/--reps 5/--reps 3 --batch 8} 2>&1 | tail -1
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
for shape in "1 2048"; do
  set -- $shape
  timeout 80 .dist/forja bench --shape qwen3-4b --peak-tflops 989 --json --batch $1 --seq-len $2 --grad-checkpointing on \
    --steps 4 --warmup 1 2>/dev/null >> $OUT/train.jsonl
done
python3 -c "
import json
for l in open('$OUT/train.jsonl'):
    d = json.loads(l); print(d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2), round(d['mfu'], 3))"
echo "all done at $SECONDS s"
