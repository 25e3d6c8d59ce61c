#!/usr/bin/env python3
"""Writes the seed inputs of the libFuzzer targets (docs/fuzzing.md) into fuzz/corpus/<target>/seed-*.

    fuzz/make_seeds.py MODEL_DIR

MODEL_DIR is the fuzz targets' example model (fuzz_support.h: `forja example`'s model, seed 1 and
the default shape: hidden 128, intermediate 384, two layers, 4 heads of 32, 2 KV heads); its config.json,
tokenizer.json, tokenizer_config.json and generation_config.json become seeds. Everything else
is written here from the formats (docs/formats.md), small, so that mutations stay fast. The seeds
are committed; the corpora beside them grow from fuzzing runs (merged with -merge=1).
"""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEP = b"\n--forja-fuzz-part--\n"  # fuzz_support.h kPartSeparator


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes); the layout of safetensors' format."""
    header = {}
    offset = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def main():
    model = sys.argv[1]
    read = lambda name: open(os.path.join(model, name), "rb").read()
    config = json.loads(read("config.json"))

    # config.json: the example (Qwen3), and the other families' fields.
    put("model_config", "qwen3", read("config.json"))
    qwen2 = dict(config, model_type="qwen2", architectures=["Qwen2ForCausalLM"], use_sliding_window=False)
    qwen2.pop("head_dim", None)
    put("model_config", "qwen2", json.dumps(qwen2))
    llama = dict(config, model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=False,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 256})
    put("model_config", "llama3", json.dumps(llama))
    mistral = dict(config, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None)
    put("model_config", "mistral", json.dumps(mistral))
    bnb = dict(config, quantization_config={
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16",
        "llm_int8_skip_modules": ["lm_head"]})
    put("model_config", "bnb4", json.dumps(bnb))

    # tokenizer.json + a text; tokenizer_config.json; generation_config.json.
    text = "Hello, world! What is 12+30? \u00e9t\u00e9 <|im_start|>user\n\u4f60\u597d<|im_end|>\n"
    put("tokenizer_json", "example", read("tokenizer.json") + SEP + text.encode())
    put("tokenizer_config", "example", read("tokenizer_config.json"))
    tc = json.loads(read("tokenizer_config.json"))
    for name, template in [
        ("llama3", "{{- bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
                   "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"),
        ("mistral", "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                    "[INST] {{ message['content'] }} [/INST]{% else %}{{ message['content'] }}"
                    "{{ eos_token }}{% endif %}{% endfor %}"),
    ]:
        put("tokenizer_config", name, json.dumps(dict(tc, chat_template=template)))
    put("tokenizer_config", "named-list",
        json.dumps(dict(tc, chat_template=[{"name": "default", "template": tc.get("chat_template", "")},
                                           {"name": "tool_use", "template": "x"}])))
    put("generation_config", "example", read("generation_config.json"))
    put("generation_config", "sampling",
        json.dumps({"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
                    "eos_token_id": [1, 2]}))

    # One JSONL line of each format; the first byte picks the options (fuzz_dataset_line.cpp).
    lines = [
        {"text": "The capital of France is Paris."},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4", "reasoning_content": "sum"}]},
        {"prompt": "Capital of Spain?", "completion": " Madrid."},
        {"input_ids": [1, 2, 3, 4, 5], "labels": [-100, -100, 3, 4, 5]},
    ]
    for i, line in enumerate(lines):
        for pick in (0, 0x43):
            put("dataset_line", "%d-%02x" % (i, pick), bytes([pick]) + json.dumps(line).encode())

    # The run configuration (YAML).
    put("run_config", "basic", "model: model\ndata: chat.jsonl\nout: run\nlr: 2e-4\nlora-rank: 16\n"
                               "lora_targets: [q, k, v, o, gate, up, down]\nschedule: cosine\n"
                               "warmup-steps: auto\nseq-len: 512\neval-data:\nprecision: mixed\n")
    put("run_config", "quoted", 'out: "my run: 1"\nmax-steps: 10\ngrad-checkpointing: on\nquant: nf4\n'
                                "# comment\nseed: 7\n")

    # A PEFT adapter for the example model: rank 1 on q_proj of both layers.
    hidden, q_dim, layers = config["hidden_size"], config["num_attention_heads"] * config["head_dim"], config["num_hidden_layers"]
    adapter_config = {"base_model_name_or_path": "model", "peft_type": "LORA", "task_type": "CAUSAL_LM",
                      "r": 1, "lora_alpha": 2, "lora_dropout": 0.0, "target_modules": ["q_proj"],
                      "bias": "none", "use_rslora": False, "use_dora": False, "inference_mode": True}
    tensors = []
    for layer in range(layers):
        p = "base_model.model.model.layers.%d.self_attn.q_proj" % layer
        tensors.append((p + ".lora_A.weight", "F32", [1, hidden], f32([0.01] * hidden)))
        tensors.append((p + ".lora_B.weight", "F32", [q_dim, 1], f32([0.02] * q_dim)))
    put("adapter", "q-rank1", json.dumps(adapter_config).encode() + SEP + safetensors(tensors))
    bf16 = [(n, "BF16", s, raw[: len(raw) // 2]) for n, _, s, raw in tensors]
    put("adapter", "q-rank1-bf16", json.dumps(dict(adapter_config, use_rslora=True)).encode() + SEP + safetensors(bf16))

    # A checkpoint's trainer_state.json + optimizer.safetensors + SHA256SUMS.
    state = {"format": "forja-trainer-state-1", "step": 2, "total_steps": 10, "epoch": 0,
             "batch_in_epoch": 2, "tokens": 891, "elapsed_s": 3.5, "skipped_nonfinite": 0, "seed": 42,
             "last_loss": 8.07, "world_size": 1, "micro_batches_per_step": 1, "batch_size": 16}
    opt = safetensors([("adam_m", "F32", [4], f32([0.1, 0.2, 0.3, 0.4])),
                       ("adam_v", "F32", [4], f32([0.01, 0.02, 0.03, 0.04]))])
    sums = ("0" * 64 + "  trainer_state.json\n" + "f" * 64 + "  optimizer.safetensors\n").encode()
    put("checkpoint", "basic", json.dumps(state).encode() + SEP + opt + SEP + sums)

    # A bitsandbytes NF4 weight [8, 64] with and without double quantisation.
    nf4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
           -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
           0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
           0.7229568362236023, 1.0]
    name = "model.layers.0.self_attn.q_proj.weight"
    codes = bytes((i * 37) % 256 for i in range(8 * 64 // 2))
    for dq in (False, True):
        qs = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [8, 64]}
        t = [(name, "U8", [len(codes), 1], codes), (name + ".quant_map", "F32", [16], f32(nf4))]
        if dq:
            qs.update(nested_blocksize=256, nested_dtype="float32", nested_offset=0.03)
            t.append((name + ".absmax", "U8", [8], bytes(range(100, 108))))
            t.append((name + ".nested_absmax", "F32", [1], f32([0.01])))
            t.append((name + ".nested_quant_map", "F32", [256], f32([(i - 128) / 128 for i in range(256)])))
        else:
            t.append((name + ".absmax", "F32", [8], f32([0.05 + 0.01 * i for i in range(8)])))
        t.append((name + ".quant_state.bitsandbytes__nf4", "U8", [len(json.dumps(qs))], json.dumps(qs).encode()))
        put("bnb4", "dq" if dq else "plain", safetensors(t, {"format": "pt"}))


if __name__ == "__main__":
    main()
