#!/usr/bin/env python3
"""torch.matmul throughput on the same shapes as `forja bench gemm`, for docs/benchmarks.md.

Runs on the GPU machine (PyTorch with CUDA). For each shape and dtype (bf16, fp16, fp32 with
TF32 off and on) it times C = A @ B^T with CUDA events: 3 warm-ups, then the median of 10 timed
runs, and prints TFLOP/s. Random normal inputs (never zeros: they run faster than real data).
"""
import sys

import torch

SHAPES = [
    (4096, 4096, 4096, "4096^3"),
    (8192, 8192, 8192, "8192^3"),
    (2048, 4096, 2560, "q_proj/o^T (4B)"),
    (2048, 1024, 2560, "k,v_proj (4B)"),
    (2048, 2560, 4096, "o_proj (4B)"),
    (2048, 9728, 2560, "gate,up (4B)"),
    (2048, 2560, 9728, "down (4B)"),
]


def bench(m, n, k, dtype, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b.T
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b.T
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return 2.0 * m * n * k / times[len(times) // 2] / 1e12


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'MxNxK':18s} {'shape':16s} {'bf16':>8s} {'fp16':>8s} {'fp32':>8s} {'tf32':>8s}")
    for m, n, k, label in SHAPES:
        r = [bench(m, n, k, torch.bfloat16, False), bench(m, n, k, torch.float16, False),
             bench(m, n, k, torch.float32, False), bench(m, n, k, torch.float32, True)]
        print(f"{m}x{n}x{k:<8d} {label:16s} " + " ".join(f"{x:8.1f}" for x in r))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
