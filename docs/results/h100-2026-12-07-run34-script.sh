#!/usr/bin/env bash
# Run 34 (twelfth session, 2026-12-07): the split-K fix-up's summing tail reading vec4s, sixteen
# slices in flight (run 33's summed pairs, eight at a time, and lost 5.7% at 1x2048). The KHR
# family's GEMM tests, then the 1x2048 step alternated with FORJA_SPLIT_K_FIXUP=0 and 1, and the
# thin split target 512 with it. Carry [".gl", ".dist"]: OUT=$OUT bash <this script>
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
F=.dist/forja SECONDS=0
timeout 60 .dist/forja_tests --gtest_filter='GemmTest.KhrCoopmatBitExactAndRandom:GemmTest.SplitK*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -4; echo "tests done at $SECONDS s"
B="bench --shape qwen3-4b --peak-tflops 989 --json"
one() {  # label, env...
  local label=$1; shift
  env "$@" timeout 40 $F $B $SHAPE 2>/dev/null | sed "s/^{/{\"run\":\"$label\",/" >> $OUT/train.jsonl
  tail -1 $OUT/train.jsonl | cut -c1-40; tail -1 $OUT/train.jsonl | grep -o '"tokens_per_s":[0-9.]*'
}
SHAPE="--batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2"
for r in 1 2; do
  one fixup0 FORJA_SPLIT_K_FIXUP=0
  one fixup1 FORJA_SPLIT_K_FIXUP=1
done
one thin512 FORJA_SPLIT_K_FIXUP=1 FORJA_SPLIT_K_THIN=512
echo "all done at $SECONDS s"
