#!/usr/bin/env bash
# Prepared in the twelfth and thirteenth sessions (2026-12-07), not run: the thirteenth session's
# device time went on starts that found no machine. Measures, in order of need:
#   tests    the fused attention tests (dq from dS both ways, AttentionTest.Fused*), and the model's
#            parity and folded-LoRA tests with dq from dS on (FORJA_ATTENTION_DQ_FROM_DS=1);
#   attn     attention alone at B 1: dq recomputed (main's default) against dq from dS, with and
#            without --model-inputs (q, k, out given in fp16 as training does), the dq-from-dS
#            kernel at 8 and 2 subgroups;
#   ablate   experiment/attn-ablate's timing ablations (results WRONG by design): what each part of
#            the fused kernels costs (bit 1 softmax / dS elementwise, 2 staging after the first
#            tile, 16 one B fragment load per k, 32 barriers, 64 the forward's rescale skipped
#            where no row maximum moved: exact), the driver's internal representations of the
#            pipelines (FORJA_PIPELINE_IR: does NVIDIA's give assembly?) and a serial profile;
#   steps    the 1x2048 step: qk0 / qk1 (FORJA_QK_BACKWARD_F16, cabe3cc), loads
#            (experiment/split-k-sum-loads) with dq recomputed as main, and ds1 (dq from dS).
# Before the call: build main, `bash bench/prepare_dist.sh`; build experiment/split-k-sum-loads
# (rebased on main) and experiment/attn-ablate, copy their stripped forja to
# .dist/forja-sumloads and .dist/forja-ablate; carry [".gl", ".dist"]: OUT=$OUT bash <this script>.
# About 300 s of command.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
FORJA_ATTENTION_DQ_FROM_DS=1 FORJA_PARITY_DIR=$PWD/.dist/parity timeout 60 .dist/forja_tests \
  --gtest_filter='AttentionTest.Fused*:TrainStep.FoldedLora*:ParityMixed.*' > $OUT/tests.txt 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.txt | head -8
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5"
attn() {  # batch, dq from dS (0/1), extra arguments
  local b=$1 ds=$2; shift 2
  echo "== B $b dq_from_ds $ds $*"
  FORJA_ATTENTION_DQ_FROM_DS=$ds timeout 40 .dist/forja $A --batch $b "$@" 2>&1 | tail -1
}
{ attn 1 0; attn 1 1; attn 1 0 --model-inputs; attn 1 1 --model-inputs; attn 1 1 --model-inputs --dq-ds-warps 8
  attn 1 1 --model-inputs --dq-ds-warps 2; } > $OUT/attn.txt 2>&1
cat $OUT/attn.txt; echo "attention done at $SECONDS s"
for a in 0 64 1 2 16 32 35 12; do
  echo "== fwd ablate $a bwd ablate $((a & 35))"
  FORJA_ATTN_ABLATE=$a FORJA_ATTN_ABLATE_BWD=$((a & 35)) timeout 25 .dist/forja-ablate $A --batch 1 2>&1 | tail -1
done > $OUT/ablate.txt 2>&1
cat $OUT/ablate.txt
mkdir -p /tmp/ir && FORJA_ATTENTION_DQ_FROM_DS=1 FORJA_PIPELINE_STATS=1 FORJA_PIPELINE_IR=/tmp/ir timeout 40 .dist/forja $A > $OUT/ir-log.txt 2>&1
ls -la /tmp/ir | head -20; tar czf $OUT/ir.tgz -C /tmp ir
FORJA_ATTENTION_DQ_FROM_DS=1 FORJA_PROFILE=serial timeout 40 .dist/forja $A --model-inputs > $OUT/attn-profile.txt 2>&1
grep -v "^forja: pipeline" $OUT/attn-profile.txt | tail -30; echo "ablations done at $SECONDS s"
B="bench --shape qwen3-4b --peak-tflops 989 --json"
one() {  # label, binary, env...
  local label=$1 bin=$2; shift 2
  env "$@" timeout 60 $bin $B $SHAPE 2>/dev/null | sed "s/^{/{\"run\":\"$label\",/" >> $OUT/train.jsonl
  tail -1 $OUT/train.jsonl | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print(d['run'], d['batch'], d['seq'], round(d['tokens_per_s']), round(d['step_ms'], 1), round(d['peak_gib'], 2))"
}
SHAPE="--batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2"
for r in 1 2; do
  one qk0 .dist/forja FORJA_QK_BACKWARD_F16=0
  one qk1 .dist/forja
  one loads .dist/forja-sumloads
  one ds1 .dist/forja FORJA_ATTENTION_DQ_FROM_DS=1
done
echo "all done at $SECONDS s"
