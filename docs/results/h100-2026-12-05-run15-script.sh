# device run 15 (final): fused attention forward (8 subgroups, 64-key tiles, fp16 copies): tests, attention, steps.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 .dist/forja_tests --gtest_filter='AttentionTest.*:ParityMixed.*:Cases/Parity.*:TrainCli.MixedPrecision*' > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) " $OUT/tests.txt | head -6; grep -B2 -A6 "Failure" $OUT/tests.txt | head -30
timeout 60 $F bench attention --impl fused,gemm > $OUT/attn.txt 2>&1; tail -4 $OUT/attn.txt
B="--shape qwen3-4b --peak-tflops 989 --json"
run() { timeout 60 $F bench $B "$@" 2>/dev/null | sed "s/^{/{\"nofused\":${FORJA_NO_FUSED_ATTENTION:-0},/" >> $OUT/train.jsonl; }
run --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2
FORJA_NO_FUSED_ATTENTION=1 run --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2
run --batch 4 --seq-len 512 --grad-checkpointing off --steps 6 --warmup 2
run --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1
python3 -c "
import json
for l in open('$OUT/train.jsonl'): d=json.loads(l); print('nofused',d['nofused'],d['batch'],d['seq'],round(d['tokens_per_s']),round(d['step_ms'],1),round(d['peak_gib'],2),round(d['mfu'],3))"
