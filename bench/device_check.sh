#!/usr/bin/env bash
# One device call that checks and measures what this checkout added since the last GPU run, for
# the `device` tool (docs/benchmarks.md says how the machine is reached). From the repository
# root, with .dist/ and .gl/ made by bench/prepare_dist.sh:
#   bash bench/device_check.sh [PEER_SCRIPT]
# writes into $OUT: tests.txt (the device-only kernel tests and parity, fused attention backward
# on: the default), tests-gemm-backward.txt (parity in mixed precision with the GEMM path's
# backward), attn.txt (bench attention with the fused forward and backward, the fused forward
# alone and the GEMM path; attn-tiles.txt: a sweep of the fused backward's workgroups),
# train.jsonl (Qwen3-4B NF4 r16 steps with and without the fused backward), peer.jsonl
# (transformers + PEFT at 1x2048 and 8x2048, same call) and a summary on stdout. About 6 minutes
# (up to 9 on a fresh machine, whose first test run compiles every pipeline: give the call 600 s)
# on an H100.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
OUT=${OUT:?run through the device tool, which sets OUT}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 360 .dist/forja_tests --gtest_filter='AttentionTest.*:GemmTest.*:KernelTable.*:TrainStep.*:ParityMixed.*:Cases/Parity.*:TrainCli.MixedPrecision*' \
  > $OUT/tests.txt 2>&1
echo "tests rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) " $OUT/tests.txt | head -8
grep -B2 -A8 "Failure" $OUT/tests.txt | head -40
# The engine with the GEMM path's backward: PyTorch parity in mixed precision and the CLI's mixed run.
FORJA_NO_FUSED_ATTENTION_BACKWARD=1 timeout 180 .dist/forja_tests --gtest_filter='ParityMixed.*:TrainCli.MixedPrecision*' \
  > $OUT/tests-gemm-backward.txt 2>&1
echo "tests with the GEMM path's backward rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |max relative" $OUT/tests-gemm-backward.txt | head -12
timeout 90 $F bench attention --impl fused-backward,fused,gemm > $OUT/attn.txt 2>&1
tail -8 $OUT/attn.txt
# The fused backward's workgroups (DQ_WARPS,DQ_KEYS,KV_WARPS,KV_QUERIES); the default is 4,64,4,64.
# One file for the sweep: the device tool brings back at most 8 files.
for t in 4,64,4,64 8,64,4,64 4,64,8,64 4,32,4,64 2,64,4,64 4,64,2,64 8,64,8,64; do
  echo "== --fused-backward-tiles $t" >> $OUT/attn-tiles.txt
  timeout 30 $F bench attention --impl fused-backward --fused-backward-tiles $t --reps 3 >> $OUT/attn-tiles.txt 2>&1
  echo "tiles $t: $(grep -E '^fused-' $OUT/attn-tiles.txt | tail -1)"
done
B="--shape qwen3-4b --peak-tflops 989 --json"
run() {
  timeout 90 $F bench $B "$@" 2>/dev/null |
    sed "s/^{/{\"fused_backward\":$((1 - ${FORJA_NO_FUSED_ATTENTION_BACKWARD:-0})),/" >> $OUT/train.jsonl
}
run --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2
FORJA_NO_FUSED_ATTENTION_BACKWARD=1 run --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2
run --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1
FORJA_NO_FUSED_ATTENTION_BACKWARD=1 run --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1
python3 -c "
import json
for l in open('$OUT/train.jsonl'):
    d = json.loads(l)
    print('fused_backward', d['fused_backward'], d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1),
          round(d['peak_gib'], 2), round(d['mfu'], 3))"
PEER=${1:-}  # ../shared/peer/hf_lora_bench.py, copied into .dist/
if [ -n "$PEER" ] && [ -f "$PEER" ]; then
  timeout 300 python3 -c "
import sys
sys.path.insert(0, '$(dirname "$PEER")')
import $(basename "$PEER" .py) as peer
for batch in (1, 8):
    try:
        peer.run('qwen3-4b', batch, 2048, True)
    except Exception as e:
        print('peer', batch, 'failed:', str(e)[:200], flush=True)
" > $OUT/peer.jsonl 2>$OUT/peer.err
  cat $OUT/peer.jsonl
fi
