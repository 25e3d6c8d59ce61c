"""Writes a bitsandbytes 4-bit (NF4) copy of a 16-bit Hugging Face model directory, the layout of
the "*-bnb-4bit" repositories, without bitsandbytes: an independent restatement of its format and
arithmetic (docs/formats.md §3; bitsandbytes functional.py quantize_4bit, quantize_blockwise,
QuantState.as_dict(packed=True), utils.pack_dict_to_tensor; backends/default/ops.py for the
pure-torch quantisers), for forja's reader tests (tests/model/test_bnb4.cpp).

    make_bnb4.py --model DIR --out DIR [--variant BLOCKSIZE:on|off ...]

writes one bnb-4bit copy per variant (blocksize, double quantisation; default 64:on) into
OUT/bnb-BLOCKSIZE-on|off (one Python start for all of them: importing torch dominates).

Every projection weight model.layers.N.{self_attn,mlp}.*_proj.weight is replaced by
    weight                               uint8 [(n+1)//2, 1], element 2k in the high nibble
    weight.absmax                        fp32 per block (uint8 codes with double quant)
    weight.quant_map                     fp32 [16], the NF4 table
    weight.nested_absmax / nested_quant_map   (double quant: fp32 per 256 absmax, the 8-bit map)
    weight.quant_state.bitsandbytes__nf4 uint8 bytes of json.dumps({quant_type, blocksize, dtype,
                                         shape[, nested_blocksize, nested_dtype, nested_offset]})
Other tensors are copied as they are (16-bit), config.json gains quantization_config, the
tokenizer files are copied. Also writes OUT/dequantized.safetensors: every projection
dequantised as bitsandbytes does (absmax = code8[q] * nested_absmax + offset, w = NF4[q] *
absmax, fp32), the reference for forja's reader.

One deliberate difference from bitsandbytes: the double-quantisation offset (mean of the fp32
absmax) is summed in float64 and rounded once, as forja does, instead of torch's float32 sum,
whose last bit depends on the summation order. The offset is stored in the quant state, so this
changes no reader; it lets the test compare the codes with forja's own quantiser bit for bit.
"""

import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
import safetensors_io  # noqa: E402

NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=torch.float32)


def dynamic_map_signed():
    """bitsandbytes create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)."""
    data = []
    max_exponent_bits, non_sign_bits = 7, 7
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1)
        boundaries = torch.linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def blocks_of(x, blocksize):
    """Flattened fp32 values padded with zeros to whole blocks: [blocks, blocksize], count."""
    flat = x.reshape(-1).to(torch.float32)
    n = flat.numel()
    blocks = (n + blocksize - 1) // blocksize
    padded = torch.zeros(blocks * blocksize, dtype=torch.float32)
    padded[:n] = flat
    return padded.view(blocks, blocksize), n


def nearest(scaled, code):
    """Index of the nearest code value (argmin |x - code|: the lower index on a tie, like the
    CUDA kernels' strict comparisons against the midpoints)."""
    return (scaled.unsqueeze(-1) - code).abs().argmin(dim=-1)


def quantize_nf4(w, blocksize):
    blocks, n = blocks_of(w, blocksize)
    absmax = blocks.abs().max(dim=1).values  # fp32, one per block
    # The kernel multiplies by the reciprocal of absmax (bitsandbytes csrc/kernels.cu).
    scaled = (blocks * (1.0 / absmax).unsqueeze(1)).clamp(-1, 1)
    q = nearest(scaled, NF4).reshape(-1)[:n].to(torch.uint8)
    if n % 2:
        q = torch.cat([q, torch.tensor([7], dtype=torch.uint8)])  # pad with the code of 0.0
    packed = (q[0::2] << 4) | q[1::2]  # even element in the high nibble
    return packed.reshape(-1, 1), absmax


def quantize_absmax(absmax, code8):
    """Double quantisation: offset = mean, blocks of 256 of the centred values, 8-bit map."""
    offset = torch.tensor(absmax.double().mean().item(), dtype=torch.float32)
    centred = absmax - offset
    blocks, n = blocks_of(centred, 256)
    nested_absmax = blocks.abs().max(dim=1).values
    scaled = blocks * (1.0 / nested_absmax).unsqueeze(1)
    q = nearest(scaled, code8).reshape(-1)[:n].to(torch.uint8)
    return q, nested_absmax, offset


def dequantize(packed, absmax, blocksize, shape):
    codes = torch.stack([packed.reshape(-1) >> 4, packed.reshape(-1) & 15], dim=1).reshape(-1)
    n = 1
    for d in shape:
        n *= d
    values = NF4[codes[:n].long()]
    scale = absmax.repeat_interleave(blocksize)[:n]
    return (values * scale).reshape(shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", action="append", default=[],
                    help="BLOCKSIZE:on|off (double quantisation); repeatable")
    a = ap.parse_args()
    for variant in a.variant or ["64:on"]:
        blocksize, dq = variant.split(":")
        if dq not in ("on", "off"):
            raise SystemExit(f"--variant {variant}: give BLOCKSIZE:on or BLOCKSIZE:off")
        write_variant(a.model, os.path.join(a.out, f"bnb-{blocksize}-{dq}"), int(blocksize), dq == "on")


def write_variant(model, out_dir, blocksize, double_quant):
    os.makedirs(out_dir, exist_ok=True)

    tensors = safetensors_io.load_file(os.path.join(model, "model.safetensors"))
    dtypes = safetensors_io.load_dtypes(os.path.join(model, "model.safetensors"))
    torch_dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    code8 = dynamic_map_signed()
    out, reference, bf16 = {}, {}, set()
    for name, t in tensors.items():
        is_linear = name.startswith("model.layers.") and name.endswith("_proj.weight")
        if not is_linear:
            # Stays 16-bit: written back in its own dtype (safetensors_io reads BF16 as fp32).
            out[name] = t
            if dtypes[name] == "BF16":
                bf16.add(name)
            continue
        packed, absmax = quantize_nf4(t, blocksize)
        state = {"quant_type": "nf4", "absmax": None, "blocksize": blocksize,
                 "quant_map": None, "dtype": torch_dtype[dtypes[name]], "shape": list(t.shape)}
        out[name] = packed
        out[name + ".quant_map"] = NF4.clone()
        if double_quant:
            q, nested_absmax, offset = quantize_absmax(absmax, code8)
            decoded = code8[q.long()] * nested_absmax.repeat_interleave(256)[:q.numel()] + offset
            out[name + ".absmax"] = q
            out[name + ".nested_absmax"] = nested_absmax
            out[name + ".nested_quant_map"] = code8.clone()
            state.update({"nested_blocksize": 256, "nested_dtype": "float32",
                          "nested_offset": offset.item()})
        else:
            decoded = absmax
            out[name + ".absmax"] = absmax
        # as_dict(packed=True): the tensors leave the dict, the rest is packed as JSON bytes.
        state = {k: v for k, v in state.items() if v is not None}
        out[name + ".quant_state.bitsandbytes__nf4"] = torch.tensor(
            list(json.dumps(state).encode("utf-8")), dtype=torch.uint8)
        reference[name] = dequantize(packed, decoded, blocksize, list(t.shape))

    # safetensors_io reads BF16 as fp32: the 16-bit tensors go back as BF16, bit for bit.
    safetensors_io.save_file(out, os.path.join(out_dir, "model.safetensors"),
                             dtype={k: "BF16" for k in bf16})
    safetensors_io.save_file(reference, os.path.join(out_dir, "dequantized.safetensors"))

    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "_load_in_4bit": True, "_load_in_8bit": False,
        "bnb_4bit_compute_dtype": config.get("torch_dtype", "bfloat16"),
        "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": double_quant, "llm_int8_enable_fp32_cpu_offload": False,
        "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": ["lm_head"],
        "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
        "quant_method": "bitsandbytes"}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in os.listdir(model):
        if name not in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(model, name), os.path.join(out_dir, name))


if __name__ == "__main__":
    main()
