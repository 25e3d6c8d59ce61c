#!/usr/bin/python3
"""Compares the logits forja dumped (forja eval --dump-logits) with the PyTorch reference's
(tests/reference/model.py, float64) for the same model and PEFT adapter directory.

    /usr/bin/python3 tests/generate/reference_logits.py MODEL_DIR ADAPTER_DIR|none DUMP.safetensors

Prints "rel X effect Y": X = max|forja - ref| / max|ref|, Y = the same for the reference with and
without the adapter (how much the adapter changes the logits).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import model as M  # noqa: E402
import safetensors_io as st  # noqa: E402

model_dir, adapter_dir, dump = sys.argv[1:4]
base = M.BaseModel.load(model_dir, dtype=torch.float64)
lora = None if adapter_dir == "none" else M.LoRA.load_peft(adapter_dir, base.cfg)
d = st.load_file(dump)
ids = d["input_ids"].round().long()
with torch.no_grad():
    ref = M.forward(base, ids[None], lora=lora)[0]
    plain = M.forward(base, ids[None])[0]
rel = float((d["logits"].double() - ref).abs().max() / ref.abs().max())
effect = float((ref - plain).abs().max() / ref.abs().max())
print(f"rel {rel:.3e} effect {effect:.3e}")
