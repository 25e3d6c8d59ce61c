# device run 6 (final): main with folded LoRA, fp16 range check, vec4 conversions, train::step in bench.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 110 .dist/forja_tests --gtest_filter='GemmTest.NvCoopmat2*:GemmTest.KhrCoopmat*:ParityMixed.*:Cases/Parity.*:ElementwiseTest.*:Nf4GpuTest.Dequantize*' > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) " $OUT/tests.txt | head -8
B="--shape qwen3-4b --peak-tflops 989 --json"
for lp in automatic fp32 automatic; do timeout 40 $F bench $B --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2 --lora-products $lp 2>/dev/null >> $OUT/train.jsonl; done
timeout 40 $F bench $B --batch 4 --seq-len 512 --grad-checkpointing off --steps 6 --warmup 2 2>/dev/null >> $OUT/train.jsonl
timeout 60 $F bench $B --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 2>/dev/null >> $OUT/train.jsonl
python3 -c "
import json
for l in open('$OUT/train.jsonl'): d=json.loads(l); print(d['batch'],d['seq'],d['lora_products'],round(d['tokens_per_s']),round(d['step_ms'],1),round(d['peak_gib'],2),round(d['plan_gib'],2),round(d['mfu'],3))"
FORJA_PROFILE=1 timeout 40 $F bench --shape qwen3-4b --batch 1 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 > $OUT/profile-1x2048.txt 2>&1; sed -n '/GPU profile/,/ms\/step/p' $OUT/profile-1x2048.txt | head -24
PYTHONUNBUFFERED=1 timeout 150 python3 .dist/peer_one.py qwen3-4b,1,2048,1 qwen3-4b,4,512,0 qwen3-4b,8,2048,1 qwen3-4b,1,2048,1 > $OUT/peer.jsonl 2>$OUT/peer.err; cut -c1-160 $OUT/peer.jsonl; tail -2 $OUT/peer.err
