#!/usr/bin/env python3
"""Measures the device memory NCCL takes on each rank (issue 31's reference for memsim's NCCL
model), through PyTorch's NCCL process group, one process a GPU: cudaMemGetInfo's free bytes
after the CUDA context, after the communicator is created (init_process_group with device_id:
ncclCommInitRank), after a first small all-reduce, after a 256 MiB all-reduce and after a
send/recv pair (the point-to-point buffers NCCL sets up lazily). PyTorch's own reserved bytes
(torch.cuda.memory_reserved) are subtracted, so the figures are NCCL's (and the driver's on its
behalf). NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Prints one JSON line per rank.

usage: nccl_memory.py [--ranks N] [--env KEY=VALUE]...   (needs N GPUs and PyTorch)"""
import argparse
import json

import torch
import torch.distributed as dist

from rank_procs import run_ranks


def used(base_free):
    """Bytes taken since base_free, less what PyTorch's allocator holds."""
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    return base_free - free - torch.cuda.memory_reserved()


def rank_main(rank, world, port, env):
    torch.cuda.set_device(rank)
    torch.zeros(1, device="cuda")  # the context, before anything of NCCL's
    torch.cuda.synchronize()
    base_free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved()
    row = {"rank": rank, "world": world, "env": env}
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    row["after_init"] = used(base_free)
    small = torch.ones(1, device="cuda")
    dist.all_reduce(small)
    row["after_small_allreduce"] = used(base_free)
    big = torch.ones(64 << 20, device="cuda")  # 256 MiB of fp32
    dist.all_reduce(big)
    row["after_256MiB_allreduce"] = used(base_free)
    row["allreduce_ok"] = bool(small.item() == world and big[0].item() == world)
    peer = (rank + 1) % world
    t = torch.ones(1 << 20, device="cuda")
    if rank % 2 == 0:
        dist.send(t, peer)
        dist.recv(t, (rank - 1) % world)
    else:
        dist.recv(t, (rank - 1) % world)
        dist.send(t, peer)
    row["after_sendrecv"] = used(base_free)
    dist.barrier()
    dist.destroy_process_group()
    row["after_destroy"] = used(base_free)
    return [row]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every rank")
    a = ap.parse_args()
    env = dict(kv.split("=", 1) for kv in a.env)
    rows = run_ranks(rank_main, a.ranks, env, timeout_s=300)
    for row in sorted(rows, key=lambda r: r["rank"]):
        row["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        print(json.dumps(row))


if __name__ == "__main__":
    main()
