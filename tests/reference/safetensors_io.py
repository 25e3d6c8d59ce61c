"""Minimal safetensors reader/writer (formats.md 2.1) for the PyTorch reference.

Debian ships no `safetensors` package, so this is a small, strict, self-contained
implementation. It is deliberately strict on read (it performs the same validation as
the Rust reference reader, ST-RS `Metadata::validate`) so that files written by forja's
C++ writer are checked here too, and it writes files the way the Rust writer does
(tensors sorted by element size descending then by name, header padded with spaces to a
multiple of 8, {"format": "pt"} metadata), so that the C++ reader sees canonical input.

Supported dtypes: F32, F16, BF16 (and F64, I64, I32, U8, I8 for convenience).
Tensors are returned as torch tensors on the CPU. BF16 is read by shifting the uint16
bit pattern into the high half of a uint32 and reinterpreting it as float32 (exact), and
written by round-to-nearest-even of the float32 bit pattern, which is what
torch's `.to(torch.bfloat16)` does too.
"""

import json
import os
import struct

import numpy as np
import torch

# dtype name -> (bytes per element, numpy dtype used for the raw bytes)
_DTYPES = {
    "F64": (8, np.dtype("<f8")),
    "F32": (4, np.dtype("<f4")),
    "F16": (2, np.dtype("<f2")),
    "BF16": (2, np.dtype("<u2")),  # raw bits; converted below
    "I64": (8, np.dtype("<i8")),
    "I32": (4, np.dtype("<i4")),
    "U8": (1, np.dtype("u1")),  # bitsandbytes packed codes and quant state (tests/model/make_bnb4.py)
    "I8": (1, np.dtype("i1")),
}

MAX_HEADER_SIZE = 100_000_000  # ST-RS MAX_HEADER_SIZE


class SafetensorsError(ValueError):
    pass


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> float32 (exact: bf16 is the top half of an f32)."""
    flat = bits.reshape(-1).astype(np.uint32) << 16  # 1-D so .view works for 0-d tensors too
    return flat.view(np.float32).reshape(bits.shape)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bfloat16 bits with round-to-nearest-even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounding_bias = ((u >> 16) & 1) + 0x7FFF
    out = ((u + rounding_bias) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0  # canonical quiet NaN
    return out


def _torch_to_bytes(t: torch.Tensor, dtype: str) -> bytes:
    t = t.detach().cpu().contiguous()
    if dtype == "BF16":
        a = f32_to_bf16_bits(t.to(torch.float32).numpy())
    elif dtype in _DTYPES:
        a = t.numpy().astype(_DTYPES[dtype][1], copy=False)
    else:
        raise SafetensorsError(f"unsupported dtype for writing: {dtype}")
    return a.tobytes(order="C")


def _default_dtype(t: torch.Tensor) -> str:
    return {
        torch.float64: "F64",
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.uint8: "U8",
        torch.int8: "I8",
    }[t.dtype]


def save_file(tensors, path, dtype=None, metadata=None):
    """Write a dict name -> torch.Tensor to `path`.

    dtype: None keeps each tensor's own dtype; a string ("F32", "BF16", "F16") converts all
    floating tensors to it; a dict name -> dtype string converts the tensors it names. Metadata always contains {"format": "pt"}.
    """
    meta = {"format": "pt"}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(v, str):
                raise SafetensorsError(f"metadata value for {k!r} must be a string")
            meta[k] = v

    entries = []
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"bad tensor name {name!r}")
        if isinstance(dtype, dict):  # per-tensor dtypes, the others keep their own
            dt = dtype.get(name) or _default_dtype(t)
        else:
            dt = dtype if (dtype is not None and t.is_floating_point()) else _default_dtype(t)
        entries.append((name, dt, list(t.shape), t))
    # Same order as the Rust writer: element size descending, then name. This keeps every
    # tensor aligned to its element size although there is no padding between tensors.
    entries.sort(key=lambda e: (-_DTYPES[e[1]][0], e[0]))

    header = {"__metadata__": meta}
    blobs = []
    offset = 0
    for name, dt, shape, t in entries:
        b = _torch_to_bytes(t, dt)
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        assert len(b) == n * _DTYPES[dt][0]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)

    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)  # pad with spaces to a multiple of 8
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)  # atomic: a crash leaves no half-written file under `path`


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise SafetensorsError(f"duplicate key {k!r} in header")
        d[k] = v
    return d


def read_header(path):
    """Return (header dict without __metadata__, metadata dict, data start offset)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: file shorter than 8 bytes")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_SIZE:
            raise SafetensorsError(f"{path}: header length {n} exceeds {MAX_HEADER_SIZE}")
        hbytes = f.read(n)
        if len(hbytes) != n:
            raise SafetensorsError(f"{path}: truncated header")
    try:
        header = json.loads(hbytes.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid UTF-8 JSON: {e}") from e
    meta = header.pop("__metadata__", {}) or {}
    return header, meta, 8 + n


def load_file(path, validate=True):
    """Read a safetensors file into a dict name -> torch.Tensor (BF16 becomes float32,
    F16 stays float16, F32 float32)."""
    header, _meta, start = read_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()

    # Validation as in ST-RS: contiguous, no gaps, sizes match shapes, file ends at last end.
    spans = []
    for name, info in header.items():
        dt = info.get("dtype")
        if dt not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {dt!r}")
        shape = info["shape"]
        b, e = info["data_offsets"]
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if e - b != n * _DTYPES[dt][0]:
            raise SafetensorsError(f"{path}: tensor {name!r} byte size does not match shape")
        spans.append((b, e, name))
    if validate:
        spans.sort()
        pos = 0
        for b, e, name in spans:
            if b != pos:
                raise SafetensorsError(f"{path}: tensor {name!r} does not start where the previous ended")
            pos = e
        if pos != len(data):
            raise SafetensorsError(f"{path}: file length does not match the last tensor's end")

    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        b, e = info["data_offsets"]
        a = np.frombuffer(data[b:e], dtype=_DTYPES[dt][1]).reshape(info["shape"])
        if dt == "BF16":
            a = bf16_bits_to_f32(a)
        out[name] = torch.from_numpy(a.copy())
    return out


def load_dtypes(path):
    """Map name -> dtype string as stored in the file (for tests that check the format)."""
    header, _meta, _ = read_header(path)
    return {k: v["dtype"] for k, v in header.items()}
