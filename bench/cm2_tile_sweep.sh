#!/usr/bin/env bash
# The NV2 GEMM tiles against each other at the training step's own product shapes, for the
# `device` tool (docs/benchmarks.md). From the repository root, with .dist/ and .gl/ made by
# bench/prepare_dist.sh:
#   OUT=... bash bench/cm2_tile_sweep.sh [M] [TILE...]
# For each tile (FORJA_CM2_TILE, ops/gemm.cpp) and the automatic choice, `forja bench gemm` times
# fp16 NT (y = x W^T) and NN (dx = dy W) at M tokens (default 16384 = 8 x 2048) and the
# (N, K) of Qwen3-4B's products with LoRA folded in (K = in + 64 forward, out + 64 backward):
# q 4096x2624, k/v 1024x2624, o 2560x4160, gate/up 9728x2624, down 2560x9792 forward; the
# backward's NN reads the same pairs the other way (2560x4160 q, 2560x1088 k/v, 4096x2624 o,
# 2560x9792 gate/up, 9728x2624 down). The bench's NN reads B at row stride N, unpadded: at
# N = 4096 that is the stride the engine no longer uses (model::dequantised_ld), so that line
# shows the slow case. Writes $OUT/cm2-tiles.txt (every line) and prints, per shape, the
# automatic tile's figure and the best four. TILEs (BMxBNxBK/threads/unroll/group_m, or auto) replace the list below.
# The first product of a process measured low (the GPU's clocks still rising): a throwaway
# 8192^3 product runs first.
set -o pipefail
source bench/device_env.sh
F=.dist/forja
OUT=${OUT:?run through the device tool, which sets OUT}
M=${1:-16384}
shift || true
tiles=("$@")
[ ${#tiles[@]} -gt 0 ] || tiles=(auto 128x256x64/256/8/1 128x128x64/256/4/8 256x128x64/256/8/1 128x256x64/256/8/8
  256x128x64/256/8/8 128x256x32/256/8/1 128x256x64/256/4/1 128x128x64/128/4/8 256x128x32/256/8/1)
sizes=""
for nk in 4096x2624 1024x2624 2560x4160 9728x2624 2560x9792 2560x1088; do sizes+="${sizes:+,}${M}x$nk"; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for t in "${tiles[@]}"; do
  FORJA_CM2_TILE= timeout 30 $F bench gemm --sizes 8192x8192x8192 --only "nv-coopmat2 f16 NT" --reps 2 > /dev/null 2>&1
  echo "== tile $t" >> $OUT/cm2-tiles.txt
  if [ $t = auto ]; then tile=""; else tile=$t; fi
  FORJA_CM2_TILE=$tile timeout 90 $F bench gemm --sizes "$sizes" --only "nv-coopmat2 f16" --reps 3 \
    >> $OUT/cm2-tiles.txt 2>&1 || echo "tile $t: rc=$?"
done
python3 - "$OUT/cm2-tiles.txt" <<'EOF'
import re, sys, collections
best = collections.defaultdict(list)
tile = None
for line in open(sys.argv[1]):
    if line.startswith('== tile '): tile = line.split()[2]; continue
    m = re.match(r'(\d+x\d+x\d+)\s+nv-coopmat2 f16 (NT|NN)\s+([\d.]+)\s+([\d.]+)', line)
    if m: best[(m[1], m[2])].append((float(m[4]), tile))
for key in sorted(best):
    rows = sorted(best[key], reverse=True)
    auto = [r for r in rows if r[1] == 'auto']
    print(key[0], key[1], 'auto %.1f' % auto[0][0] if auto else '', ' | '.join('%s %.1f' % (t, f) for f, t in rows[:4]))
EOF
