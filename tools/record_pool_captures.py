#!/usr/bin/env python3
"""Records CUDA-graph captures of many batch sizes for the shared-pool check (issue 32).

Usage (needs PyTorch with CUDA):  python3 tools/record_pool_captures.py OUTDIR [capture|side]
(`capture`, the default: every warm-up runs on the capture stream, as vLLM's do; `side`: on
another stream, as PyTorch's documentation shows.)
- OUTDIR/graph_b{N}.pickle: one memory snapshot per size, each size captured alone into its own
  private pool (the graph body memsim's `program: {source: snapshot}` reads);
- OUTDIR/shared_{order}_{outputs}.json: the bytes of the one private pool PyTorch held after
  capturing every size into it (torch.cuda.graph(pool=...)), per capture order (ascending,
  large_first, random) and output lifetime: `held` keeps each graph's output tensor, `dropped`
  deletes it right after its capture (vLLM's weak outputs).
Each measurement runs in its own process. The model is a 2-layer Llama-3.1-8B-shaped MLP decode
step (hidden 4096, intermediate 14336, vocab 128256, bf16, fp32 logits, argmax).
"""
import json
import os
import random
import subprocess
import sys

SIZES = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 513, 16))  # vLLM's 51 up to 512


def model(torch):
    hidden, inter, vocab = 4096, 14336, 128256
    g = torch.Generator(device="cuda").manual_seed(0)
    layers = [(torch.randn(hidden, inter, device="cuda", dtype=torch.bfloat16, generator=g),
               torch.randn(inter, hidden, device="cuda", dtype=torch.bfloat16, generator=g))
              for _ in range(2)]
    head = torch.randn(hidden, vocab, device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn(max(SIZES), hidden, device="cuda", dtype=torch.bfloat16, generator=g)

    def step(batch):
        h = x[:batch]
        for up, down in layers:
            h = h + torch.nn.functional.silu(h @ up) @ down
        return (h @ head).float().argmax(dim=-1)

    return step, [layers, head, x]


def warm_up(torch, step, batch, stream):
    """Two eager steps on `stream` (vLLM warms up on its capture stream, so the GEMM library's
    workspace for that stream exists before any capture; PyTorch's documentation warms up on a
    side stream, and the first capture then allocates the capture stream's workspace into its
    own pool)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(batch)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def streams(torch, warmup):
    capture = torch.cuda.Stream()
    return capture, (capture if warmup == "capture" else torch.cuda.Stream())


def pool_bytes(torch, pool):
    """Bytes of the segments of private pool `pool` (a graph_pool_handle)."""
    total = 0
    for seg in torch.cuda.memory_snapshot():
        if tuple(seg.get("segment_pool_id", (0, 0))) == tuple(pool):
            total += seg["total_size"]
    return total


def private(outdir, warmup):
    import torch
    step, keep = model(torch)
    capture, side = streams(torch, warmup)
    graphs = []
    for b in SIZES:
        warm_up(torch, step, b, side)
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=100000)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=capture):
            out = step(b)
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(os.path.join(outdir, f"graph_b{b}.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
        graphs.append((g, out))


def shared(outdir, warmup, order, outputs):
    import torch
    step, keep = model(torch)
    capture, side = streams(torch, warmup)
    sizes = {"ascending": SIZES, "large_first": sorted(SIZES, reverse=True),
             "random": random.Random(1).sample(SIZES, len(SIZES))}[order]
    pool = torch.cuda.graph_pool_handle()
    graphs, held, after = [], [], []
    for b in sizes:
        warm_up(torch, step, b, side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=capture):
            out = step(b)
        torch.cuda.synchronize()
        graphs.append(g)
        if outputs == "held":
            held.append(out)
        del out
        after.append(pool_bytes(torch, pool))
    result = {"warmup": warmup, "order": order, "outputs": outputs, "sizes": sizes, "pool_bytes": after[-1],
              "pool_bytes_after_each": after, "torch": torch.__version__,
              "device": torch.cuda.get_device_name()}
    with open(os.path.join(outdir, f"shared_{order}_{outputs}.json"), "w") as f:
        json.dump(result, f, indent=1)


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "--private":
        private(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) >= 6 and sys.argv[1] == "--shared":
        shared(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
        return
    outdir, warmup = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "capture")
    if warmup not in ("capture", "side"):
        sys.exit("usage: record_pool_captures.py OUTDIR [capture|side]")
    os.makedirs(outdir, exist_ok=True)
    runs = [["--private", outdir, warmup]]
    for order in ("ascending", "large_first", "random"):
        for outputs in ("held", "dropped"):
            runs.append(["--shared", outdir, warmup, order, outputs])
    rc = 0
    for args in runs:
        r = subprocess.run([sys.executable, __file__] + args)
        print(" ".join(args[:1] + args[2:]), f"rc={r.returncode}", flush=True)
        rc |= r.returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()
