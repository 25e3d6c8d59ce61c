#!/usr/bin/env bash
# Prepared for the next session's first device run (not yet run): timing ablations of the fused
# attention kernels on the current code, to say where the backward's dk/dv kernel spends its time
# now (results wrong by design). Before: build `experiment/attn-ablate` (1f6cbdf, main c4acb32 +
# the ablation bits) in a separate worktree and copy its stripped `forja` to .dist/forja-ablate
# beside main's .dist/forja (bash bench/prepare_dist.sh). Carry [".gl", ".dist"]:
# OUT=$OUT bash <this script>.
set -o pipefail
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
A="bench attention --seq-len 2048 --heads 32 --kv-heads 8 --head-dim 128 --impl fused-backward --reps 5 --model-inputs"
{
  echo "== main"; timeout 30 .dist/forja $A 2>&1 | tail -1
  echo "== ablate binary, nothing left out"; timeout 30 .dist/forja-ablate $A 2>&1 | tail -1
  for f in 1 2 4 8 32 34 12; do
    echo "== forward $f"; FORJA_ATTN_ABLATE=$f timeout 30 .dist/forja-ablate $A 2>&1 | tail -1
  done
  for b in 1 2 4 8 32 34 35; do
    echo "== dk/dv $b"; FORJA_ATTN_ABLATE_BWD=$b timeout 30 .dist/forja-ablate $A 2>&1 | tail -1
  done
  echo "== dk/dv 35, serial profile"
  FORJA_ATTN_ABLATE_BWD=35 FORJA_PROFILE=serial timeout 40 .dist/forja-ablate $A 2>&1 | grep -v "^forja: pipeline" | grep -A6 "GPU profile"
  echo "== main, serial profile"
  FORJA_PROFILE=serial timeout 40 .dist/forja $A 2>&1 | grep -v "^forja: pipeline" | grep -A6 "GPU profile"
} > $OUT/ablate.txt 2>&1
cat $OUT/ablate.txt; echo "all done at $SECONDS s"
