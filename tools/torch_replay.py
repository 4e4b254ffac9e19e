#!/usr/bin/env python3
"""Replays a memsim allocation program (ops.csv from `memsim replay`) through PyTorch's real
allocator on a GPU and records torch.cuda.memory_reserved() after every op: the independent
reference for memsim's torch_caching (and, with backend:cudaMallocAsync, for cuda_async).

Usage (needs PyTorch with CUDA):
  PYTORCH_CUDA_ALLOC_CONF=... python3 tools/torch_replay.py OPS.csv OUT.csv
OUT.csv: op,reserved_bytes,allocated_bytes. Initial blocks (live before the trace) are allocated
first, in order; every stream index gets its own torch.cuda.Stream (0 = the default stream)."""
import csv
import sys

import torch


def main():
    ops_path, out_path = sys.argv[1], sys.argv[2]
    with open(ops_path, newline="") as f:
        ops = list(csv.DictReader(f))
    torch.cuda.init()
    streams = {0: torch.cuda.default_stream()}
    live = {}
    rows = []
    torch.cuda.synchronize()
    base = torch.cuda.memory_reserved()
    if base != 0:
        sys.exit(f"torch_replay: {base} bytes reserved before the replay; start a fresh process")
    for op in ops:
        kind, sid = op["kind"], int(op["stream"])
        if sid not in streams:
            streams[sid] = torch.cuda.Stream()
        if kind in ("alloc", "initial"):
            with torch.cuda.stream(streams[sid]):
                live[op["id"]] = torch.empty(int(op["bytes"]), dtype=torch.uint8, device="cuda")
        elif kind == "free":
            del live[op["id"]]
        elif kind == "empty_cache":
            torch.cuda.empty_cache()
        rows.append((op["op"], torch.cuda.memory_reserved(), torch.cuda.memory_allocated()))
    with open(out_path, "w") as f:
        f.write("op,reserved_bytes,allocated_bytes\n")
        for r in rows:
            f.write(f"{r[0]},{r[1]},{r[2]}\n")
    print(f"torch_replay: {len(rows)} ops, peak reserved {torch.cuda.max_memory_reserved()}, "
          f"final reserved {torch.cuda.memory_reserved()}")


if __name__ == "__main__":
    main()
