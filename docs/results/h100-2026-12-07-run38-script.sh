#!/usr/bin/env bash
# Run 38 (2026-12-07): one branch per tile for the mask (the forward's softmax, the dk/dv kernel's
# elementwise dS^T) against forja-r37 (run 37's binary, main 990e7d8). Carry [".gl", ".dist"]:
# OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
FORJA_PARITY_DIR=$PWD/.dist/parity timeout 90 .dist/forja_tests \
  --gtest_filter='AttentionTest.Fused*:ParityMixed.*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
{
  for r in 1 2; do
    echo "== r37"; timeout 40 .dist/forja-r37 $A 2>&1 | tail -1
    echo "== new"; timeout 40 .dist/forja $A 2>&1 | tail -1
  done
  echo "== r37 B 4"; timeout 40 .dist/forja-r37 $A --batch 4 2>&1 | tail -1
  echo "== new B 4"; timeout 40 .dist/forja $A --batch 4 2>&1 | tail -1
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
FORJA_PIPELINE_STATS=1 FORJA_PROFILE=serial timeout 40 .dist/forja $A > $OUT/attn-profile.txt 2>&1
grep -E "flash_bwd|flash_fwd" $OUT/attn-profile.txt | sed 's/Binary Size.*//'
grep -v "^forja: pipeline" $OUT/attn-profile.txt | grep -A6 "GPU profile"; echo "profile done at $SECONDS s"
B="bench --shape qwen3-4b --peak-tflops 989 --json"
one() {  # label, binary, env...
  local label=$1 bin=$2; shift 2
  env "$@" timeout 60 $bin $B $SHAPE 2>/dev/null | sed "s/^{/{\"run\":\"$label\",/" >> $OUT/train.jsonl
  tail -1 $OUT/train.jsonl | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print(d['run'], d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2))"
}
SHAPE="--batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2"
for r in 1 2; do
  one r37 .dist/forja-r37
  one new .dist/forja
done
echo "all done at $SECONDS s"
