#!/usr/bin/env bash
# Prepared in the twelfth session (2026-12-07), not run (the session's device time ran out). Two
# changes, each alternated at 1x2048 (three pairs) and 8x2048 (one pair), after their tests on the
# GPU:
#   qk     main's q/k norm and RoPE backward in one pass into the fp16 copies (cabe3cc):
#          .dist/forja with FORJA_QK_BACKWARD_F16=0 ("qk0") and without ("qk1");
#   loads  gemm_split_k issuing sixteen slices' loads before adding (branch
#          experiment/split-k-sum-loads, rebased on main): .dist/forja-sumloads against .dist/forja.
# Build main, `bash bench/prepare_dist.sh`; build the branch and copy its stripped forja to
# .dist/forja-sumloads; carry [".gl", ".dist"]: OUT=$OUT bash <this script>
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
timeout 60 .dist/forja_tests --gtest_filter='RopeTest.*:TrainStep.FoldedLora*:GemmTest.SplitK*:GemmTest.Fp16*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -4; echo "tests done at $SECONDS s"
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
for r in 1 2 3; do
  one qk0 .dist/forja FORJA_QK_BACKWARD_F16=0
  one qk1 .dist/forja
  [ -x .dist/forja-sumloads ] && one loads .dist/forja-sumloads
done
SHAPE="--batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1"
one qk0 .dist/forja FORJA_QK_BACKWARD_F16=0
one qk1 .dist/forja
[ -x .dist/forja-sumloads ] && one loads .dist/forja-sumloads
echo "all done at $SECONDS s"
