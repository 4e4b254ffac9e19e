#!/usr/bin/env python3
"""Measures what memsim's tensor-parallel model prices and counts (issue 31), one process a GPU:

1. Time of NCCL all-reduce and all-gather (bf16, through PyTorch's NCCL process group) at sizes
   from 2 KiB to 256 MiB, replayed inside a CUDA graph (as a decode step runs them) and eager:
   the median of many calls, in microseconds. The sim's collective cost model is fitted to these.
2. The device memory of a custom all-reduce in the style of vLLM's (custom_all_reduce.py): an
   uncached "meta" buffer of meta_size() + max_size and a data buffer of max_size, each cudaMalloc'd
   and shared with every peer by CUDA IPC, peers' handles opened; then rank_data (8 MiB through
   the caching allocator); then graph-buffer registration (the IPC handles of 64 more allocations
   opened on every peer, as register_graph_buffers does for a captured graph's inputs).
   cudaMemGetInfo's free bytes are read after each step (the driver API, through libcuda).

3. Time of an NCCL send/recv pair (bf16, eager, as vLLM sends a pipeline stage's intermediate
   tensors outside its CUDA graphs) from rank 0 to rank 1 at the same sizes: 10 pairs issued
   back to back behind a busy stream (the host's launch latency hidden, as behind a forward
   pass), the median of 20 such runs per pair; the slower rank's is the pair's.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Prints one JSON line per rank and size.
usage: collective_bench.py [--ranks N] [--env KEY=VALUE]... [--send-recv-only]
       (needs N GPUs and PyTorch)"""
import argparse
import ctypes
import json
import statistics

import torch
import torch.distributed as dist

from rank_procs import run_ranks

SIGNAL_BYTES = 2560  # sizeof(vllm::Signal): start/end flags [36][8] u32, _flag [36] u32, 128-aligned
MAX_SIZE = 8 << 20   # vLLM's custom all-reduce max_size


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]

    def raw(self):
        return bytes(self.reserved)

    @staticmethod
    def of(raw):
        h = IpcHandle()
        ctypes.memmove(ctypes.addressof(h), raw, 64)
        return h


def driver():
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cu.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcHandle), ctypes.c_uint64]
    cu.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), IpcHandle, ctypes.c_uint]
    cu.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    return cu


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def free_bytes(cu):
    torch.cuda.synchronize()
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    check(cu.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t)), "cuMemGetInfo")
    return f.value


def shared_buffer(cu, nbytes, world):
    """cudaMalloc + IPC handle, handles exchanged, every peer's opened (vLLM create_shared_buffer)."""
    ptr = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(ptr), nbytes), "cuMemAlloc")
    h = IpcHandle()
    check(cu.cuIpcGetMemHandle(ctypes.byref(h), ptr), "cuIpcGetMemHandle")
    handles = [None] * world
    dist.all_gather_object(handles, h.raw())
    opened = []
    for r, raw in enumerate(handles):
        if r == dist.get_rank():
            continue
        p = ctypes.c_uint64()
        check(cu.cuIpcOpenMemHandle_v2(ctypes.byref(p), IpcHandle.of(raw), 1), "cuIpcOpenMemHandle")
        opened.append(p.value)
    return ptr.value, opened


def custom_ar_memory(world):
    cu = driver()
    row = {"kind": "custom_ar_memory", "rank": dist.get_rank(), "world": world}
    base = free_bytes(cu)
    shared_buffer(cu, SIGNAL_BYTES + MAX_SIZE, world)
    row["after_meta"] = base - free_bytes(cu)
    shared_buffer(cu, MAX_SIZE, world)
    row["after_buffer"] = base - free_bytes(cu)
    rank_data = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    row["after_rank_data"] = base - free_bytes(cu)
    graph_inputs = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(64)]
    row["after_64_inputs"] = base - free_bytes(cu)
    for t in graph_inputs:  # register_graph_buffers: every peer opens each input's segment
        h = IpcHandle()
        check(cu.cuIpcGetMemHandle(ctypes.byref(h), ctypes.c_uint64(t.data_ptr())), "handle")
        handles = [None] * world
        dist.all_gather_object(handles, h.raw())
        for r, raw in enumerate(handles):
            if r != dist.get_rank():
                p = ctypes.c_uint64()
                rc = cu.cuIpcOpenMemHandle_v2(ctypes.byref(p), IpcHandle.of(raw), 1)
                if rc == 0:
                    row["opened"] = row.get("opened", 0) + 1
    row["after_register"] = base - free_bytes(cu)
    del rank_data
    return row


def time_us(fn, graph, iters):
    """Median microseconds per call of fn (inside a CUDA graph of `iters` calls when graph)."""
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        run = g.replay
        calls = iters
    else:
        run = fn
        calls = 1
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(max(5, 200 // calls)):
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1000.0 / calls)
    return statistics.median(samples)


def collective_times(world):
    rows = []
    for shift in range(11, 29):  # 2 KiB .. 256 MiB
        nbytes = 1 << shift
        x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(nbytes // 2 * world, dtype=torch.bfloat16, device="cuda")
        iters = 20 if nbytes <= (16 << 20) else 4
        for graph in (True, False):
            ar = time_us(lambda: dist.all_reduce(x), graph, iters)
            ag = time_us(lambda: dist.all_gather_into_tensor(out, x), graph, iters)
            rows.append({"kind": "collective", "rank": dist.get_rank(), "world": world,
                         "bytes": nbytes, "graph": graph, "all_reduce_us": round(ar, 3),
                         "all_gather_us": round(ag, 3)})
    return rows


def send_recv_times(world, pairs=10):
    """Rank 0 sends to rank 1 (the others wait): median microseconds of a pair on this rank's
    stream, from `pairs` pairs issued back to back while the stream is still busy (as vLLM issues
    a stage's sends behind its forward pass), so that the host's launch latency is hidden."""
    rows = []
    rank = dist.get_rank()
    for shift in range(11, 29):  # 2 KiB .. 256 MiB
        nbytes = 1 << shift
        x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")

        def pair():
            if rank == 0:
                dist.send(x, 1)
            elif rank == 1:
                dist.recv(x, 0)

        for _ in range(3):
            pair()
        torch.cuda.synchronize()
        samples = []
        for _ in range(20):
            dist.barrier()
            torch.cuda._sleep(4_000_000)  # about 2 ms: every launch below queues behind it
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(pairs):
                pair()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) * 1000.0 / pairs)
        rows.append({"kind": "send_recv", "rank": rank, "world": world, "bytes": nbytes,
                     "graph": False, "send_recv_us": round(statistics.median(samples), 3)})
    return rows


def rank_main(rank, world, port, env):
    torch.cuda.set_device(rank)
    torch.zeros(1, device="cuda")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    if env.get("MEMSIM_SEND_RECV_ONLY") == "1":
        rows = send_recv_times(world)
        dist.barrier()
        dist.destroy_process_group()
        return rows
    rows = [custom_ar_memory(world)]
    rows += collective_times(world)
    rows += send_recv_times(world)
    dist.barrier()
    dist.destroy_process_group()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every rank")
    ap.add_argument("--send-recv-only", action="store_true", help="time only the send/recv pairs")
    a = ap.parse_args()
    env = dict(kv.split("=", 1) for kv in a.env)
    if a.send_recv_only:
        env["MEMSIM_SEND_RECV_ONLY"] = "1"
    rows = run_ranks(rank_main, a.ranks, env)
    version = ".".join(map(str, torch.cuda.nccl.version()))
    for row in sorted(rows, key=lambda r: (r["kind"], r.get("bytes", 0), r["rank"])):
        row["nccl_version"] = version
        print(json.dumps(row))


if __name__ == "__main__":
    main()
