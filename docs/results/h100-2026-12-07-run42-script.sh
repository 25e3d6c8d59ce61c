#!/usr/bin/env bash
# Run 42 (2026-12-07, sixteenth session): the dk/dv kernel with its subgroup pairs splitting the
# query tile and head_dim (--dkv-d-split, FORJA_ATTENTION_DKV_D_SPLIT) against main's, in one
# binary: the GPU tests of the fused kernels, registers, attention at B 1, 4, 8, serial profiles,
# the 1x2048 step. The option is not on main: build 06d1331 with h100-2026-12-07-run42-dkv-d-split.patch
# applied, then bash bench/prepare_dist.sh. Carry [".gl", ".dist"]: OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
timeout 200 .dist/forja_tests --gtest_filter='AttentionTest.Fused*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
{
  echo "== registers"
  FORJA_PIPELINE_STATS=1 timeout 30 .dist/forja $A --reps 1 --dkv-d-split 1 2>&1 | grep -i -A3 "flash_bwd" | grep -iE "flash_bwd|register" | head -12
  FORJA_PIPELINE_STATS=1 timeout 30 .dist/forja $A --reps 1 --dkv-d-split 1 --fused-backward-tiles 4,64,4,32 2>&1 | grep -i -A3 "flash_bwd_dkv" | grep -iE "flash_bwd|register" | head -6
  for round in 1 2; do
    echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
    echo "== d-split 8 subgroups"; timeout 30 .dist/forja $A --dkv-d-split 1 2>&1 | tail -1
    echo "== d-split 4 subgroups (32 keys)"; timeout 30 .dist/forja $A --dkv-d-split 1 --fused-backward-tiles 4,64,4,32 2>&1 | tail -1
  done
  echo "== d-split, split target 512"; timeout 30 .dist/forja $A --dkv-d-split 1 --dkv-split-target 512 2>&1 | tail -1
  echo "== d-split, split target 2048"; timeout 30 .dist/forja $A --dkv-d-split 1 --dkv-split-target 2048 2>&1 | tail -1
  for b in 4 8; do
    echo "== main B$b"; timeout 40 .dist/forja ${A/--reps 5/--reps 3 --batch $b} 2>&1 | tail -1
    echo "== d-split B$b"; timeout 40 .dist/forja ${A/--reps 5/--reps 3 --batch $b} --dkv-d-split 1 2>&1 | tail -1
  done
  echo "== main, serial profile"
  FORJA_PROFILE=serial timeout 40 .dist/forja $A 2>&1 | grep -v "^forja: pipeline" | grep -A8 "GPU profile"
  echo "== d-split, serial profile"
  FORJA_PROFILE=serial timeout 40 .dist/forja $A --dkv-d-split 1 2>&1 | grep -v "^forja: pipeline" | grep -A8 "GPU profile"
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
for split in 0 1 0 1; do
  FORJA_ATTENTION_DKV_D_SPLIT=$split timeout 80 .dist/forja bench --shape qwen3-4b --peak-tflops 989 --json --batch 1 \
    --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 1 2>/dev/null | sed "s/^{/{\"dkv_d_split\": $split, /" >> $OUT/train.jsonl
done
python3 -c "
import json
for l in open('$OUT/train.jsonl'):
    d = json.loads(l); print(d['dkv_d_split'], d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2), round(d['mfu'], 3))"
echo "all done at $SECONDS s"
