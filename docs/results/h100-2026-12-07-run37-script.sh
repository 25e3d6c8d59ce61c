#!/usr/bin/env bash
# Run 37 (2026-12-07): dq from dS with the next tile's K and dS prefetched into registers (main
# after run 36: the leaner forward softmax, PIPELINE removed), against forja-prev (003217a: the
# old forward, dq from dS turned on by variable, 8 subgroups). Carry [".gl", ".dist"]:
# OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
FORJA_PARITY_DIR=$PWD/.dist/parity timeout 90 .dist/forja_tests \
  --gtest_filter='AttentionTest.Fused*:TrainStep.FoldedLora*:ParityMixed.*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
{
  for r in 1 2; do
    echo "== prev"; FORJA_ATTENTION_DQ_FROM_DS=1 timeout 40 .dist/forja-prev $A --dq-ds-warps 8 2>&1 | tail -1
    echo "== new"; timeout 40 .dist/forja $A 2>&1 | tail -1
  done
  echo "== new --dq-ds-warps 4"; timeout 40 .dist/forja $A --dq-ds-warps 4 2>&1 | tail -1
  echo "== prev B 4"; FORJA_ATTENTION_DQ_FROM_DS=1 timeout 40 .dist/forja-prev $A --dq-ds-warps 8 --batch 4 2>&1 | tail -1
  echo "== new B 4"; timeout 40 .dist/forja $A --batch 4 2>&1 | tail -1
} > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
FORJA_PIPELINE_STATS=1 FORJA_PROFILE=serial timeout 40 .dist/forja $A > $OUT/attn-profile.txt 2>&1
grep -E "flash_bwd|flash_fwd" $OUT/attn-profile.txt | sed 's/Binary Size.*//'
grep -v "^forja: pipeline" $OUT/attn-profile.txt | grep -A8 "GPU profile"; echo "profile done at $SECONDS s"
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
  one prev .dist/forja-prev FORJA_ATTENTION_DQ_FROM_DS=1
  one new .dist/forja
done
echo "all done at $SECONDS s"
