#!/usr/bin/env bash
# Run 31 (twelfth session, 2026-12-07): split-K in one dispatch (the subgroup-scope GEMM kernels'
# FIXUP variants sum their slices themselves). Tests on the GPU, then the 1x2048 step alternated
# with FORJA_SPLIT_K_FIXUP=0 (the two-dispatch path, as main before) and 1 (the default), the thin
# split target swept, and 8x2048 once each. Carry [".gl", ".dist"]: OUT=$OUT bash <this script>
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
F=.dist/forja SECONDS=0
FORJA_PARITY_DIR=$PWD/.dist/parity timeout 200 .dist/forja_tests \
  --gtest_filter='GpuContext.*:GemmTest.*:TrainStep.*:ParityMixed.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head; echo "tests done at $SECONDS s"
B="bench --shape qwen3-4b --peak-tflops 989 --json"
one() {  # label, env..., then shape args
  local label=$1; shift
  env "$@" timeout 60 $F $B $SHAPE 2>/dev/null | sed "s/^{/{\"run\":\"$label\",/" >> $OUT/train.jsonl
  tail -1 $OUT/train.jsonl | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print(d['run'], d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2))"
}
SHAPE="--batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2"
for r in 1 2 3; do
  one fixup0 FORJA_SPLIT_K_FIXUP=0
  one fixup1 FORJA_SPLIT_K_FIXUP=1
done
for t in 256 512 2048; do one thin$t FORJA_SPLIT_K_THIN=$t; done
echo "1x2048 done at $SECONDS s"
SHAPE="--batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1"
one fixup0 FORJA_SPLIT_K_FIXUP=0
one fixup1 FORJA_SPLIT_K_FIXUP=1
echo "all done at $SECONDS s"
