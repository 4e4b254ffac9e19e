#!/usr/bin/env python3
"""Independent reference for memsim's torch_caching model: replays memsim's decode allocation
programs through PyTorch's real CUDACachingAllocator (a fresh torch.cuda.MemPool per program) and
compares the pool's reserved bytes with what memsim predicts. Needs a GPU and PyTorch.

usage: torch_reference.py DUMP_BINARY MODEL_YAML BATCH [BATCH ...]"""
import json
import subprocess
import sys

import torch


def replay(ops):
    pool = torch.cuda.MemPool()
    live = {}
    with torch.cuda.use_mem_pool(pool):
        for op in ops:
            if op[0] == "a":
                live[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
            else:
                del live[op[1]]
    torch.cuda.synchronize()
    reserved = sum(seg["total_size"] for seg in pool.snapshot())
    live.clear()
    del pool
    return reserved


def main():
    dump, model, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3:]]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'batch':>6} {'ops':>6} {'memsim reserved':>16} {'torch reserved':>16}  match")
    mismatches = 0
    for b in batches:
        prog = json.loads(subprocess.check_output([dump, model, str(b)]))
        real = replay(prog["ops"])
        ok = real == prog["reserved"]
        mismatches += not ok
        print(f"{b:>6} {len(prog['ops']):>6} {prog['reserved']:>16} {real:>16}  "
              f"{'yes' if ok else 'NO'}")
    print(f"{len(batches) - mismatches}/{len(batches)} programs match exactly")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
