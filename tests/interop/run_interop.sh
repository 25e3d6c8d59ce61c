#!/usr/bin/env bash
# Adapter interoperability, forja <-> transformers + PEFT, for tiny random Qwen3 and Llama
# models (dense base: --quant none). Run from the repository root on a machine with a Vulkan GPU
# and python3 with torch, transformers, peft and safetensors (the H200 machine:
# `source bench/device_env.sh` first):
#     tests/interop/run_interop.sh [path/to/forja]          (default .dist/forja)
# For each family:
#   base    forja's logits and eval loss without adapter vs transformers
#   (a)     an adapter written by forja (random A, B != 0) loaded by PeftModel.from_pretrained
#   (b)     an adapter written by PEFT (init_lora_weights=False, so B != 0) loaded by forja
# Prints PASS/FAIL lines with the max relative differences (tolerance 1e-3); exit 1 on any FAIL.
set -u
FORJA=${1:-.dist/forja}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$FORJA" ] || { echo "FAIL: $FORJA is not an executable forja (give its path as the first argument)"; exit 1; }
if ! $PY -c "import torch, transformers, peft, safetensors" 2>/dev/null; then
  echo "FAIL: $PY lacks one of torch, transformers, peft, safetensors:"
  $PY -c "import torch, transformers, peft, safetensors" 2>&1 | tail -1
  echo "(install or carry the missing packages, e.g. a peft wheel, and run again)"
  exit 1
fi
$PY -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
W=$(mktemp -d /tmp/forja_interop.XXXXXX)
fail=0
check() { "$@" || fail=1; }
for family in qwen3 llama; do
  M=$W/$family/model
  $PY "$HERE/interop.py" make-model --family $family --out "$M" || { echo "FAIL $family: could not make the model"; fail=1; continue; }
  eval_args="--model $M --data $M/data.jsonl --quant none --seq-len 64 --json"
  # base
  if $FORJA eval $eval_args --dump-logits "$W/$family/base.safetensors" > "$W/$family/base.json"; then
    check $PY "$HERE/interop.py" compare --model "$M" --logits "$W/$family/base.safetensors" \
      --eval-json "$W/$family/base.json" --data "$M/data.jsonl" --name "$family base (no adapter)"
  else echo "FAIL $family base: forja eval failed"; fail=1; fi
  # (a) forja -> PEFT
  if $FORJA random-adapter --model "$M" --out "$W/$family/forja_adapter" --rank 8 --alpha 16 --seed 3 --b-scale 0.1 \
     && $FORJA eval $eval_args --adapter "$W/$family/forja_adapter" --dump-logits "$W/$family/a.safetensors" > "$W/$family/a.json"; then
    check $PY "$HERE/interop.py" compare --model "$M" --adapter "$W/$family/forja_adapter" --logits "$W/$family/a.safetensors" \
      --eval-json "$W/$family/a.json" --data "$M/data.jsonl" --name "$family (a) forja adapter in PeftModel"
  else echo "FAIL $family (a): forja could not write or use its adapter"; fail=1; fi
  # (b) PEFT -> forja
  if $PY "$HERE/interop.py" peft-adapter --model "$M" --out "$W/$family/peft_adapter" \
     && $FORJA eval $eval_args --adapter "$W/$family/peft_adapter" --dump-logits "$W/$family/b.safetensors" > "$W/$family/b.json"; then
    check $PY "$HERE/interop.py" compare --model "$M" --adapter "$W/$family/peft_adapter" --logits "$W/$family/b.safetensors" \
      --eval-json "$W/$family/b.json" --data "$M/data.jsonl" --name "$family (b) PEFT adapter in forja"
  else echo "FAIL $family (b): PEFT adapter not made or not loaded by forja"; fail=1; fi
  # generation runs on the same model and adapter (no reference: a smoke test of the CLI)
  $FORJA generate --model "$M" --adapter "$W/$family/peft_adapter" --prompt "hello world" --max-new-tokens 8 \
    --quant none > /dev/null 2>"$W/$family/gen.err" && echo "PASS $family generate runs" \
    || { echo "FAIL $family generate: $(tail -1 "$W/$family/gen.err")"; fail=1; }
done
echo "work files: $W"
[ $fail = 0 ] && echo "INTEROP PASS" || echo "INTEROP FAIL"
exit $fail
