# device run 11: fused attention forward (flash_forward_khr.comp): tests, attention figures, step A/B.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 .dist/forja_tests --gtest_filter='AttentionTest.*:ParityMixed.*' > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |no fused" $OUT/tests.txt | head; grep -B2 -A8 "Failure" $OUT/tests.txt | head -40
timeout 60 $F bench attention --impl fused,gemm > $OUT/attn.txt 2>&1; tail -5 $OUT/attn.txt
FORJA_PROFILE=1 timeout 60 $F bench attention --impl fused --reps 3 > $OUT/attn-profile.txt 2>&1; grep -E "^  (attention|coopmat)" $OUT/attn-profile.txt | head -12
B="--shape qwen3-4b --peak-tflops 989 --json"
for v in 0 1 0; do FORJA_NO_FUSED_ATTENTION=$v timeout 50 $F bench $B --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2 2>/dev/null | sed "s/^{/{\"nofused\":$v,/" >> $OUT/train.jsonl; done
for v in 0 1; do FORJA_NO_FUSED_ATTENTION=$v timeout 60 $F bench $B --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 2>/dev/null | sed "s/^{/{\"nofused\":$v,/" >> $OUT/train.jsonl; done
python3 -c "
import json
for l in open('$OUT/train.jsonl'): d=json.loads(l); print('nofused',d['nofused'],d['batch'],d['seq'],round(d['tokens_per_s']),round(d['step_ms'],1),round(d['peak_gib'],2),round(d['mfu'],3))"
