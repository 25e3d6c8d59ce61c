# device run 4: LoRA folded into the NF4 products; 1x2048 (fold vs fp32 LoRA, twice), 4x512, 8x2048; profile; the peer at all three.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 .dist/forja_tests --gtest_filter='GemmTest.NvCoopmat2*:GemmTest.KhrCoopmat*:ParityMixed.*:Nf4GpuTest.*:ElementwiseTest.*' > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |\[parity\] (step-0)" $OUT/tests.txt | head -30
B="--shape qwen3-4b --peak-tflops 989 --json"
for lp in automatic fp32 automatic fp32; do timeout 60 $F bench $B --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2 --lora-products $lp 2>/dev/null >> $OUT/train.jsonl; done
timeout 60 $F bench $B --batch 4 --seq-len 512 --grad-checkpointing off --steps 6 --warmup 2 2>/dev/null >> $OUT/train.jsonl
timeout 120 $F bench $B --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 2>/dev/null >> $OUT/train.jsonl
cat $OUT/train.jsonl | cut -c1-420
FORJA_PROFILE=1 timeout 60 $F bench --shape qwen3-4b --batch 1 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 > $OUT/profile-1x2048.txt 2>&1; sed -n '/GPU profile/,/memory plan/p' $OUT/profile-1x2048.txt | head -42
PYTHONUNBUFFERED=1 timeout 200 python3 .dist/peer_one.py qwen3-4b,1,2048,1 qwen3-4b,4,512,0 qwen3-4b,8,2048,1 > $OUT/peer.jsonl 2>$OUT/peer.err; cat $OUT/peer.jsonl; tail -3 $OUT/peer.err
