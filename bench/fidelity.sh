#!/usr/bin/env bash
# Issue 14.4 on the device machine: a random Qwen3-4B-shaped bf16 checkpoint, 20 steps of forja
# (--precision fp32 and mixed, 16-bit base: the same weights as the reference) and of
# transformers + PEFT (fp32 base) from the same adapter on the same sequences; per-step losses
# compared (bench/fidelity.py compare, tolerance 1e-2 relative). Run from the repository root
# with a built forja: bash bench/fidelity.sh FORJA WORKDIR [SHAPE]. Writes WORKDIR/fidelity.txt.
set -euo pipefail
F=${1:?forja binary}
W=${2:?work directory}
SHAPE=${3:-qwen3-4b}
STEPS=20 SEQ=2048 LR=1e-4
mkdir -p "$W"
python3 bench/fidelity.py make "$W/model" --shape "$SHAPE" --seq $SEQ --steps $STEPS
"$F" random-adapter --model "$W/model" --out "$W/init" --rank 16 --alpha 32 --seed 1 --b-scale 0.01
python3 bench/fidelity.py peft "$W/model" "$W/init" "$W/peft.json" --steps $STEPS --lr $LR
for p in fp32 mixed; do
  "$F" train --model "$W/model" --data "$W/model/ids.jsonl" --out "$W/forja-$p" --init-adapter "$W/init" \
    --quant none --precision $p --seq-len $SEQ --batch-size 1 --grad-accum 1 --max-steps $STEPS --epochs 1 \
    --lr $LR --lr-schedule constant --warmup-steps 0 --weight-decay 0 --adam-beta1 0.9 --adam-beta2 0.999 \
    --adam-eps 1e-8 --max-grad-norm 1.0 --lora-rank 16 --lora-alpha 32 --lora-dropout 0 --no-shuffle on \
    --packing off --log-every 1 --save-every 0
done
python3 bench/fidelity.py compare "$W/peft.json" "$W/forja-fp32/metrics.jsonl" "$W/forja-mixed/metrics.jsonl" \
  | tee "$W/fidelity.txt"
