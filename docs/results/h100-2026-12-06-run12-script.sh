#!/usr/bin/env bash
# Run 2 (2026-12-06, fifth session): the fused forward's tiles and prefetch; NV2 tiles and K
# splits at M = 2048 (1x2048, 4x512); the step with each.
set -o pipefail
source bench/device_env.sh
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in 1 8; do
  for t in 8,64,0 8,64,1 4,64,0 4,64,1 4,32,1 8,32,1 2,64,1; do
    echo "== B $b tiles $t" >> $OUT/attn.txt
    timeout 60 $F bench attention --impl fused-backward --fused-forward-tiles $t --batch $b --reps 5 2>&1 | grep -E "^fused-backward " >> $OUT/attn.txt
  done
done
cat $OUT/attn.txt | paste - - | awk '{print $2, $4, $6, $9, $10}'; echo "attention done at $SECONDS s"
bash bench/cm2_tile_sweep.sh 2048 auto 128x160x64/128/4/8 64x128x64/128/4/8 128x64x64/128/4/8 64x256x64/128/4/8 128x192x64/128/4/8 > $OUT/tiles-summary.txt 2>&1
sizes=""; for nk in 4096x2624 1024x2624 2560x4160 9728x2624 2560x9792 2560x1088; do sizes+="${sizes:+,}2048x$nk"; done
for n in 264 396 528 792; do
  echo "== split $n" >> $OUT/cm2-tiles.txt
  FORJA_SPLIT_K_NV2=$n timeout 90 $F bench gemm --sizes "$sizes" --only "nv-coopmat2 f16" --reps 3 >> $OUT/cm2-tiles.txt 2>&1
done
grep -E "^==|^2048" $OUT/cm2-tiles.txt | awk '/^==/{print; next}{printf "  %s %s %s\n", $1, $4, $6}'; echo "gemm done at $SECONDS s"
B="--shape qwen3-4b --peak-tflops 989 --json"
step() {  # label, env..., then bench args
  local label=$1; shift
  env "$@" timeout 90 $F bench $B $ARGS 2>/dev/null | sed "s/^{/{\"label\":\"$label\",/" >> $OUT/train.jsonl
  tail -1 $OUT/train.jsonl | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print(d['label'], d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 3))"
}
ARGS="--batch 1 --seq-len 2048 --grad-checkpointing on --steps 5 --warmup 2"
step base FORJA_SPLIT_K_NV2=0
for n in 264 396 528; do step split$n FORJA_SPLIT_K_NV2=$n; done
step tile160 FORJA_CM2_TILE=128x160x64/128/4/8
step base2 FORJA_SPLIT_K_NV2=0
ARGS="--batch 4 --seq-len 512 --grad-checkpointing off --steps 5 --warmup 2"
step base FORJA_SPLIT_K_NV2=0
step split396 FORJA_SPLIT_K_NV2=396
step split528 FORJA_SPLIT_K_NV2=528
echo "all done at $SECONDS s"
