#!/usr/bin/env bash
# Run 3 (2026-12-06, fifth session): .dist/forja = the forward's prefetch (4,64), dk/dv split
# across query heads, NV2 split-K for long K; .dist/forja-before = de5076c. Tests, attention,
# GEMMs at M 2048, a 1x2048 profile, the step A/B with the peer.
set -o pipefail
source bench/device_env.sh
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
F=.dist/forja
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 .dist/forja_tests --gtest_filter='GemmTest.NvCoopmat2BitExactAndRandom:AttentionTest.*:NormTest.*:ParityMixed.*:BenchCli.*:MemoryPlan.*:TrainStep.*:Parity.*' > $OUT/tests.txt 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" $OUT/tests.txt | head -20; echo "tests done at $SECONDS s"
for b in 1 8; do
  for bin in .dist/forja-before $F; do
    echo "== B $b $bin" >> $OUT/attn.txt
    timeout 60 $bin bench attention --impl fused-backward --batch $b --reps 5 2>&1 | grep -E "^fused-backward " >> $OUT/attn.txt
  done
done
for t in 0 512 2048; do
  echo "== B 1 dkv-split-target $t" >> $OUT/attn.txt
  timeout 60 $F bench attention --impl fused-backward --dkv-split-target $t --reps 5 2>&1 | grep -E "^fused-backward " >> $OUT/attn.txt
done
echo "== B 4 S 512" >> $OUT/attn.txt
timeout 60 $F bench attention --impl fused-backward --batch 4 --seq-len 512 --reps 5 2>&1 | grep -E "^fused-backward " >> $OUT/attn.txt
paste - - < $OUT/attn.txt | awk '{print $0}' | cut -c1-150; echo "attention done at $SECONDS s"
sizes=""; for nk in 4096x2624 1024x2624 2560x4160 9728x2624 2560x9792 2560x1088; do sizes+="${sizes:+,}2048x$nk"; done
for bin in .dist/forja-before $F; do
  echo "== $bin" >> $OUT/gemm.txt
  timeout 90 $bin bench gemm --sizes "$sizes" --only "nv-coopmat2 f16" --reps 3 >> $OUT/gemm.txt 2>&1
done
grep -E "^==|^2048" $OUT/gemm.txt | awk '/^==/{print; next}{printf "  %s %s %s\n", $1, $4, $6}'; echo "gemm done at $SECONDS s"
FORJA_PROFILE=1 timeout 90 $F bench --shape qwen3-4b --peak-tflops 989 --batch 1 --seq-len 2048 --grad-checkpointing on --steps 4 --warmup 2 > $OUT/profile-1x2048.txt 2>&1
head -44 $OUT/profile-1x2048.txt | tail -34; grep -E "peak GPU|memory plan" $OUT/profile-1x2048.txt; echo "profile done at $SECONDS s"
AB_ROUNDS=1 AB_SHAPES="1x2048:ckpt 8x2048:ckpt 4x512" bash bench/ab_step.sh .dist/hf_lora_bench.py
echo "all done at $SECONDS s"
