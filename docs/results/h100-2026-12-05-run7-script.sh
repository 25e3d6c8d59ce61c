# device run 7: NV2 flash attention (flash_attention_cm2.comp): tests, tile sweep, step.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 .dist/forja_tests --gtest_filter='FlashAttentionTest.*' > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error" $OUT/tests.txt | head -30
timeout 60 $F bench attention --impl flash,gemm > $OUT/attn.txt 2>&1; tail -6 $OUT/attn.txt
for cfg in "64 64 128" "128 64 128" "64 128 128" "128 128 256" "64 64 256" "32 32 128" "128 64 256"; do set -- $cfg
  echo "== tiles $1x$2 wg $3"; timeout 40 $F bench attention --impl flash --flash-kernel coopmat2 --block-q $1 --block-k $2 --workgroup-size $3 > $OUT/attn-$1-$2-$3.txt 2>&1; tail -2 $OUT/attn-$1-$2-$3.txt; done
B="--shape qwen3-4b --peak-tflops 989 --json"
for at in flash gemm; do timeout 50 $F bench $B --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2 --attention $at 2>&1 >> $OUT/train.jsonl | tail -2; done
python3 -c "
import json
for l in open('$OUT/train.jsonl'): d=json.loads(l); print(d['batch'],d['seq'],d.get('attention'),round(d['tokens_per_s']),round(d['step_ms'],1),round(d['peak_gib'],2),round(d['mfu'],3))"
