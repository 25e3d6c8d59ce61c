# device run 9: NV2 flash attention experiment: per-kernel tiles, workgroup size, pipelining, GEMM-only ceiling.
source bench/device_env.sh
F=.dist/forja
nvidia-smi --query-gpu=name --format=csv,noheader
n=0
while read -r cfg; do n=$((n+1))
  echo "== $cfg"; FORJA_FLASH_CM2="$cfg" FORJA_PROFILE=1 timeout 40 $F bench attention --impl flash --flash-kernel coopmat2 --reps 5 > $OUT/x$n.txt 2>&1; echo "rc=$?"; grep -A1 "^impl" $OUT/x$n.txt | tail -1 | cut -c1-70; grep -E "^  flash_attention_(forward|backward_dq|backward_dkdv) " $OUT/x$n.txt | awk '{print $1, $3/$2, $5}'
done <<'CFG'
32 32 128 32 32 128 32 32 128 0 0
32 32 128 32 32 128 32 32 128 1 0
64 32 128 64 32 128 32 64 128 0 0
64 32 128 64 32 128 32 64 128 1 0
64 64 256 64 64 256 64 64 256 0 0
64 32 256 64 32 256 32 64 256 0 0
128 32 256 128 32 256 32 128 256 0 0
64 64 256 64 64 256 64 64 256 0 1
32 32 128 32 32 128 32 32 128 0 1
64 32 128 64 32 128 32 64 128 0 1
128 64 256 128 64 256 64 128 256 0 1
CFG
