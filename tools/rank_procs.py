"""Shared by the multi-GPU measurement tools: one process a GPU (torch.multiprocessing spawn),
NVLink multicast off in every rank, each rank's rows collected; a rank that fails stops them all.

run_ranks(target, ranks, env) calls target(rank, world, port, env) in each process; target
returns a list of JSON-able rows (dicts). Returns every rank's rows, or exits naming the rank
that failed."""
import os
import socket
import traceback

import torch.multiprocessing as mp

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(target, rank, world, port, env, out):
    os.environ.update(MULTICAST_OFF)
    os.environ.update(env)
    try:
        rows = target(rank, world, port, env)
    except Exception:  # noqa: BLE001 -- reported, then every rank is stopped
        rows = [{"kind": "error", "rank": rank, "error": traceback.format_exc()}]
    out.put(rows)


def run_ranks(target, ranks, env, timeout_s=600):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(target, r, ranks, port, env, q))
             for r in range(ranks)]
    for p in procs:
        p.start()
    rows = []
    for _ in procs:
        got = q.get(timeout=timeout_s)
        if got and got[0].get("kind") == "error":  # the other ranks wait on it: stop them all
            for p in procs:
                p.kill()
            raise SystemExit(f"rank {got[0]['rank']} failed: {got[0]['error']}")
        rows += got
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a rank exited with {p.exitcode}")
    return rows
