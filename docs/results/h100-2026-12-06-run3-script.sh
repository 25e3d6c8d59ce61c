source bench/device_env.sh  # (run as bench/.ab.sh, with .dist/forja-old = main at cacfa02 beside .dist/forja)
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
timeout 150 .dist/forja_tests --gtest_filter='ElementwiseTest.*:ParityMixed.*' > $OUT/tests.txt 2>&1; echo "tests rc=$?"
grep -E "^\[  (FAILED|PASSED) " $OUT/tests.txt
B="bench --shape qwen3-4b --grad-checkpointing on --json"
j() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["tokens_per_s"]), round(d["step_ms"],1), round(d["peak_gib"],2))'; }
for i in 1 2; do for f in forja-old forja; do
  echo "$f 1x2048 $(timeout 60 .dist/$f $B --batch 1 --seq-len 2048 --steps 8 --warmup 2 2>/dev/null | j)"
done; done
for f in forja-old forja; do
  echo "$f 8x2048 $(timeout 90 .dist/$f $B --batch 8 --seq-len 2048 --steps 3 --warmup 1 2>/dev/null | j)"
done
for f in forja-old forja; do
  FORJA_PROFILE=1 timeout 60 .dist/$f bench --shape qwen3-4b --grad-checkpointing on --batch 1 --seq-len 2048 --steps 4 --warmup 2 > $OUT/profile-1x2048-$f.txt 2>&1
  grep -E "to_f16_block|tokens/s" $OUT/profile-1x2048-$f.txt | sed "s/^/$f /"
done
