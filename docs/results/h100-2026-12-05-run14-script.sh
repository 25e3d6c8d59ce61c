# device run 14: fused attention forward experiment (fp16 inputs built in this time).
source bench/device_env.sh
F=.dist/forja
for cfg in "8 64 1" "4 64 1" "8 32 1" "8 64 0" "4 32 0"; do
  echo "== $cfg"; FORJA_FUSED_CFG="$cfg" FORJA_PROFILE=1 timeout 40 $F bench attention --impl fused --reps 5 > "$OUT/x-${cfg// /-}.txt" 2>&1; echo "rc=$?"; grep -A1 "^impl" "$OUT/x-${cfg// /-}.txt" | tail -1; grep -E "^  (attention_fused_forward|to_f16_block) " "$OUT/x-${cfg// /-}.txt"
done
B="--shape qwen3-4b --peak-tflops 989 --json"
for cfg in "8 64 1" "8 64 0" "nofused"; do if [ "$cfg" = nofused ]; then export FORJA_NO_FUSED_ATTENTION=1; fi; FORJA_FUSED_CFG="$cfg" timeout 50 $F bench $B --batch 1 --seq-len 2048 --grad-checkpointing on --steps 6 --warmup 2 2>/dev/null | sed "s/^{/{\"cfg\":\"$cfg\",/" >> $OUT/train.jsonl; done
unset FORJA_NO_FUSED_ATTENTION
FORJA_FUSED_CFG="8 64 1" timeout 60 $F bench $B --batch 8 --seq-len 2048 --grad-checkpointing on --steps 3 --warmup 1 2>/dev/null | sed "s/^{/{\"cfg\":\"8 64 1\",/" >> $OUT/train.jsonl
python3 -c "
import json
for l in open('$OUT/train.jsonl'): d=json.loads(l); print(d['cfg'],d['batch'],d['seq'],round(d['tokens_per_s']),round(d['step_ms'],1),round(d['peak_gib'],2))"
