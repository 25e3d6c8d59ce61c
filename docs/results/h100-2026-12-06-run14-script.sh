#!/usr/bin/env bash
# Ran 2026-12-06 ~16:15 UTC (sixth session) as run 14, on main 37ed3c1 (fbb69b7 plus docs and the env_workgroups refactor).
# Run 14 (2026-12-06, fifth session): .dist/forja at fbb69b7 (dk/dv split, NV2 split-K, the LoRA
# factor beside W in the dequantisation, four words per dequantising invocation). What the
# session's last device time allowed, most important first: the new kernels' tests, the step at
# three shapes (this binary only; de5076c's figures on this kind of card are runs 11 and 13), the
# peer, a 1x2048 profile, the forward's tiles.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 60 .dist/forja_tests --gtest_filter='Nf4GpuTest.Dequantize*:ParityMixed.Qwen3Nf4:ParityMixed.Qwen3Nf4FlashAttentionCheckpointing:BenchCli.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
AB_BINARIES=after AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" bash bench/ab_step.sh .dist/hf_lora_bench.py
echo "step and peer done at $SECONDS s"
FORJA_PROFILE=1 timeout 40 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 2 > $OUT/profile-1x2048.txt 2>&1
head -44 $OUT/profile-1x2048.txt | tail -34; grep -E "peak GPU|memory plan" $OUT/profile-1x2048.txt; echo "profile done at $SECONDS s"
for t in 8,64,0 8,64,1 4,64,0; do
  echo "== B 1 tiles $t" >> $OUT/attn.txt
  timeout 15 $F bench attention --impl fused-backward --fused-forward-tiles $t --reps 5 2>&1 | grep -E "^fused-backward " >> $OUT/attn.txt
done
paste - - < $OUT/attn.txt | cut -c1-150; echo "all done at $SECONDS s"
