# device run 3 (2026-12-05 session 2): LoRA products on fp16 operands vs fp32; 1x2048, 8x2048, 4x512; profiles; peer.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 .dist/forja_tests --gtest_filter='GemmTest.NvCoopmat2*:GemmTest.KhrCoopmat*:ParityMixed.*:Cases/Parity.*' > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |\[parity\] (qwen|step-0)" $OUT/tests.txt | head -50
B="--shape qwen3-4b --peak-tflops 989 --json"
for lp in fp16 fp32 fp16 fp32; do timeout 60 $F bench $B --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2 --lora-products $lp 2>/dev/null >> $OUT/train.jsonl; done
timeout 60 $F bench $B --batch 4 --seq-len 512 --grad-checkpointing off --steps 6 --warmup 2 2>/dev/null >> $OUT/train.jsonl
timeout 120 $F bench $B --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 2>/dev/null >> $OUT/train.jsonl
cat $OUT/train.jsonl
FORJA_PROFILE=1 timeout 60 $F bench --shape qwen3-4b --batch 1 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 > $OUT/profile-1x2048.txt 2>&1; sed -n '/GPU profile/,/memory plan/p' $OUT/profile-1x2048.txt | head -45
FORJA_PROFILE=1 timeout 120 $F bench --shape qwen3-4b --batch 8 --seq-len 2048 --grad-checkpointing on --steps 2 --warmup 1 > $OUT/profile-8x2048.txt 2>&1; sed -n '/GPU profile/,/memory plan/p' $OUT/profile-8x2048.txt | head -45
PYTHONUNBUFFERED=1 timeout 100 python3 .dist/peer_one.py qwen3-4b,1,2048,1 > $OUT/peer.jsonl 2>$OUT/peer.err; cat $OUT/peer.jsonl; tail -3 $OUT/peer.err
