#!/usr/bin/env bash
# The Qwen3-4B training step (NF4, r16 on all seven, mixed, checkpointing) of two forja binaries
# on one device, alternated, and the peer in the same call, for the `device` tool
# (docs/benchmarks.md). From the repository root, with .dist/ and .gl/ made by
# bench/prepare_dist.sh and the baseline binary copied to .dist/forja-before:
#   OUT=... bash bench/ab_step.sh [PEER_SCRIPT]
# writes $OUT/train.jsonl (one line per run, "binary" added: before or after) and
# $OUT/peer.jsonl, and prints tokens/s per run. AB_SHAPES (BATCHxSEQ[:ckpt], space-separated;
# default "1x2048:ckpt 8x2048:ckpt") picks the shapes, each for forja and the peer; AB_ROUNDS
# (default 2) how many before/after pairs each shape gets; AB_BINARIES=after runs only .dist/forja.
# AB_AFTER_ENV (e.g. "FORJA_ATTENTION_PAIRED=0") is set for the "after" runs only; without
# .dist/forja-before, "before" is .dist/forja too, so one binary is measured with and without it.
set -o pipefail
source bench/device_env.sh
OUT=${OUT:?run through the device tool, which sets OUT}
B="--shape qwen3-4b --peak-tflops 989 --json"
shapes=(${AB_SHAPES:-1x2048:ckpt 8x2048:ckpt})
for shape in "${shapes[@]}"; do
  bs=${shape%%:*} batch=${bs%x*} seq=${bs#*x}
  ckpt=off; [ "${shape#*:}" = ckpt ] && ckpt=on
  steps="--steps 6 --warmup 2"; [ $((batch * seq)) -gt 8192 ] && steps="--steps 3 --warmup 1"
  for bin in $(for _ in $(seq ${AB_ROUNDS:-2}); do echo ${AB_BINARIES:-before after}; done); do
    f=.dist/forja; [ $bin = before ] && [ -x .dist/forja-before ] && f=.dist/forja-before
    after_env=(); [ $bin = after ] && [ -n "${AB_AFTER_ENV:-}" ] && after_env=($AB_AFTER_ENV)
    env "${after_env[@]}" timeout 120 $f bench $B --batch $batch --seq-len $seq --grad-checkpointing $ckpt $steps 2>/dev/null |
      sed "s/^{/{\"binary\":\"$bin\",/" >> $OUT/train.jsonl
    tail -1 $OUT/train.jsonl | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print(d['binary'], d['batch'], d['seq'], d['grad_ckpt'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2), round(d['mfu'], 3))"
  done
done
PEER=${1:-}
if [ -n "$PEER" ] && [ -f "$PEER" ]; then
  timeout 300 python3 -c "
import sys
sys.path.insert(0, '$(dirname "$PEER")')
import $(basename "$PEER" .py) as peer
for shape in '${shapes[*]}'.split():
    bs, _, ckpt = shape.partition(':')
    batch, seq = map(int, bs.split('x'))
    try:
        peer.run('qwen3-4b', batch, seq, ckpt == 'ckpt')
    except Exception as e:
        print('peer', shape, 'failed:', str(e)[:200], flush=True)
" > $OUT/peer.jsonl 2>$OUT/peer.err
  cat $OUT/peer.jsonl
fi
