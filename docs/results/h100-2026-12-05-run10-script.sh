# device run 10: NV2 flash attention (final form) tests and figures; step profile at 1x2048 and 8x2048.
set -o pipefail
source bench/device_env.sh
F=.dist/forja
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 .dist/forja_tests --gtest_filter='FlashAttentionTest.*' > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) " $OUT/tests.txt | head; grep -B2 -A8 "Failure" $OUT/tests.txt | head -60
timeout 60 $F bench attention > $OUT/attn.txt 2>&1; tail -5 $OUT/attn.txt
B="--shape qwen3-4b --peak-tflops 989 --json"
for at in flash gemm; do timeout 50 $F bench $B --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2 --attention $at 2>/dev/null >> $OUT/train.jsonl; done
python3 -c "
import json
for l in open('$OUT/train.jsonl'): d=json.loads(l); print(d['batch'],d['seq'],d.get('attention'),round(d['tokens_per_s']),round(d['step_ms'],1),round(d['peak_gib'],2),round(d['mfu'],3))"
for bs in "1 2048" "8 2048"; do set -- $bs; FORJA_PROFILE=1 timeout 90 $F bench --shape qwen3-4b --batch $1 --seq-len $2 --grad-checkpointing on --steps 3 --warmup 1 > $OUT/profile-$1x$2.txt 2>&1; echo "== profile $1x$2"; sed -n '/GPU profile/,$p' $OUT/profile-$1x$2.txt | head -45; done
