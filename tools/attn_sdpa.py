#!/usr/bin/env python3
"""SDPA side of memsim-attn-bench: times torch scaled_dot_product_attention over contiguous K/V.

For each shape it tries PyTorch's fused backends (flash, cuDNN, memory-efficient) one at a time
and reports the fastest that runs, as lines `decode B L seconds backend` and
`prefill L seconds backend` (median seconds per call; calls captured in a CUDA graph).
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [
    ("flash", SDPBackend.FLASH_ATTENTION),
    ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ("efficient", SDPBackend.EFFICIENT_ATTENTION),
]


def time_calls(fn, reps, trials=7):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm up on the side stream before capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(times)


def best(make_fn, reps):
    results = []
    errors = []
    for name, backend in BACKENDS:
        try:
            with sdpa_kernel([backend]):
                fn = make_fn()
                fn()
                torch.cuda.synchronize()
                results.append((time_calls(fn, reps), name))
        except Exception as e:  # backend does not support this shape or GQA
            errors.append(f"{name}: {type(e).__name__}")
            torch.cuda.synchronize()
    if not results:
        raise RuntimeError("no SDPA backend ran: " + "; ".join(errors))
    return min(results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--decode", action="append", default=[], help="BATCHxCONTEXT")
    ap.add_argument("--prefill", action="append", type=int, default=[])
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    dev = "cuda"
    hq, hkv, d = a.q_heads, a.kv_heads, a.head_dim
    for shape in a.decode:
        b, l = (int(x) for x in shape.split("x"))
        q = torch.rand(b, hq, 1, d, device=dev, dtype=dtype) * 2 - 1
        k = torch.rand(b, hkv, l, d, device=dev, dtype=dtype) * 2 - 1
        v = torch.rand(b, hkv, l, d, device=dev, dtype=dtype) * 2 - 1
        kv_bytes = 2 * k.numel() * k.element_size()
        reps = max(5, min(200, (8 << 30) // kv_bytes))

        def make(q=q, k=k, v=v):
            return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        secs, name = best(make, reps)
        print(f"decode {b} {l} {secs:.9g} {name}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    for l in a.prefill:
        q = torch.rand(1, hq, l, d, device=dev, dtype=dtype) * 2 - 1
        k = torch.rand(1, hkv, l, d, device=dev, dtype=dtype) * 2 - 1
        v = torch.rand(1, hkv, l, d, device=dev, dtype=dtype) * 2 - 1

        def make(q=q, k=k, v=v):
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                          enable_gqa=True)

        secs, name = best(make, 10)
        print(f"prefill {l} {secs:.9g} {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
