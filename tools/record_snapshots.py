#!/usr/bin/env python3
"""Records the PyTorch memory-snapshot fixtures of tests/data/snapshots on a GPU machine.

Usage (needs PyTorch with CUDA):  python3 tools/record_snapshots.py OUTDIR [NAME...]
Each fixture runs in its own process (PYTORCH_CUDA_ALLOC_CONF is read once per process) and
writes OUTDIR/NAME.pickle (torch.cuda.memory._dump_snapshot) and OUTDIR/NAME.json: what PyTorch
itself reported (max_memory_reserved, memory_reserved at the dump, the allocator conf, the torch
version), the independent figures memsim's replay must reproduce.
"""
import json
import os
import random
import subprocess
import sys

KIB = 1024
MIB = 1024 * 1024

# name -> (PYTORCH_CUDA_ALLOC_CONF, workload, record frames)
FIXTURES = {
    "steps_default": ("", "steps", False),
    "prestate_default": ("", "prestate", False),
    "streams_default": ("", "streams", False),
    "frames_default": ("", "small", True),
    "steps_expandable": ("expandable_segments:True", "steps", False),
    "steps_roundup4": ("roundup_power2_divisions:4", "steps", False),
    "steps_maxsplit": ("max_split_size_mb:24", "steps", False),
    "steps_gc": ("garbage_collection_threshold:0.5", "steps_gc", False),
    # One CUDA-graph capture of a small MLP decode step per batch size (shapes experiment).
    "graph_b1": ("", "graph1", False),
    "graph_b8": ("", "graph8", False),
    "graph_b64": ("", "graph64", False),
}


def sizes_of_step(rng, batch, ctx):
    """Byte sizes of the tensors of one forward-like step (activations, logits, workspaces)."""
    hidden = 4096
    out = [batch * hidden * 2, batch * hidden * 2 * 3, batch * 14336 * 2 * 2, batch * 14336 * 2,
           batch * 128256 * 4 if batch <= 64 else batch * 32000 * 4,
           batch * ctx * 16 + 512, rng.randrange(1, 64) * KIB, rng.randrange(1, 900) * KIB]
    return out


def workload_steps(torch, rng):
    held = []
    for step in range(60):
        batch = rng.choice([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128])
        ctx = rng.choice([128, 512, 2048, 8192])
        live = []
        for n in sizes_of_step(rng, batch, ctx):
            live.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
            if len(live) > 3 and rng.random() < 0.5:
                live.pop(rng.randrange(len(live)))  # free out of order
        if rng.random() < 0.3:
            held.append(torch.empty(rng.randrange(1, 30) * MIB + rng.randrange(0, 4096),
                                    dtype=torch.uint8, device="cuda"))
        if held and rng.random() < 0.25:
            held.pop(rng.randrange(len(held)))
        del live
        if step % 20 == 19:
            torch.cuda.empty_cache()
    return held  # live at the dump


def workload_gc(torch, rng):
    """Steps, then requests of ever-changing large sizes: each misses the cache and leaves an
    unsplit cached segment behind, so reserved memory passes the GC threshold."""
    held = workload_steps(torch, rng)
    for i in range(60):
        x = torch.empty((11 + (i * 7) % 37) * MIB + rng.randrange(0, 4096), dtype=torch.uint8,
                        device="cuda")
        y = torch.empty(rng.randrange(1, 900) * KIB, dtype=torch.uint8, device="cuda")
        del x
        if rng.random() < 0.5:
            held.append(y)
        if len(held) > 8:
            held.pop(0)
    return held


def workload_graph(torch, batch):
    """Records only the capture of one CUDA graph (torch.cuda.graph, its private pool) of a
    4-layer MLP step at `batch`; weights and the static input exist before recording."""
    hidden, inter, vocab = 1024, 3584, 32000
    layers = [(torch.randn(hidden, inter, device="cuda", dtype=torch.bfloat16),
               torch.randn(inter, hidden, device="cuda", dtype=torch.bfloat16)) for _ in range(4)]
    head = torch.randn(hidden, vocab, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(batch, hidden, device="cuda", dtype=torch.bfloat16)

    def step():
        h = x
        for up, down in layers:
            h = h + torch.nn.functional.silu(h @ up) @ down
        return (h @ head).argmax(dim=-1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=100000)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    torch.cuda.synchronize()
    return [g, out, layers, head, x]


def workload_prestate(torch, rng):
    # Before recording: segments with live blocks and cached free blocks.
    before = [torch.empty(n, dtype=torch.uint8, device="cuda")
              for n in (300 * KIB, 700 * KIB, 5 * MIB, 12 * MIB, 30 * MIB, 3 * MIB)]
    del before[1], before[2]  # free 700 KiB and 12 MiB: cached, split segments
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=100000)
    held = workload_steps(torch, rng)
    del before[0]  # a block allocated before recording, freed inside the window
    return held + before


def workload_streams(torch, rng):
    side = torch.cuda.Stream()
    held = []
    for step in range(40):
        a = torch.empty(rng.randrange(1, 8) * MIB, dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(side):
            b = torch.empty(rng.randrange(64, 2048) * KIB, dtype=torch.uint8, device="cuda")
            c = torch.empty(rng.randrange(12, 40) * MIB, dtype=torch.uint8, device="cuda")
            torch.cuda._sleep(20000)  # keep the side stream busy so record_stream defers frees
        a.record_stream(side)
        del a, b
        if rng.random() < 0.5:
            held.append(c)
        del c
        if len(held) > 4:
            held.pop(0)
    torch.cuda.synchronize()
    held.append(torch.empty(1 * MIB, dtype=torch.uint8, device="cuda"))  # processes events
    return held


def workload_small(torch, rng):
    held = []
    for i in range(30):
        t = torch.empty(rng.randrange(1, 3000) * KIB, dtype=torch.uint8, device="cuda")
        if rng.random() < 0.6:
            held.append(t)
        if len(held) > 5:
            held.pop(rng.randrange(len(held)))
    return held


def run_one(name, outdir):
    import torch
    conf, workload, frames = FIXTURES[name]
    rng = random.Random(sum(map(ord, name)))
    torch.cuda.init()
    fraction = 0.0014 if workload == "steps_gc" else None
    if fraction is not None:  # ~210 MB of an H200: the GC threshold (0.5) is often passed
        torch.cuda.set_per_process_memory_fraction(fraction)
    if workload != "prestate" and not workload.startswith("graph"):
        # prestate and graph start recording themselves, after their first tensors
        # context=None records no stack frames (small fixtures); frames_default keeps them.
        torch.cuda.memory._record_memory_history(enabled="all", context="all" if frames else None,
                                                 stacks="python", max_entries=100000)
    torch.cuda.reset_peak_memory_stats()
    fn = {"steps": workload_steps, "steps_gc": workload_gc,
          "prestate": workload_prestate, "streams": workload_streams, "small": workload_small}
    if workload.startswith("graph"):
        held = workload_graph(torch, int(workload[len("graph"):]))
    else:
        held = fn[workload](torch, rng)
    torch.cuda.synchronize()
    path = os.path.join(outdir, name + ".pickle")
    torch.cuda.memory._dump_snapshot(path)
    info = {"name": name, "conf": conf, "torch": torch.__version__,
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "memory_reserved": torch.cuda.memory_reserved(),
            "memory_allocated": torch.cuda.memory_allocated(),
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "held": len(held), "device": torch.cuda.get_device_name(),
            "total_memory": torch.cuda.mem_get_info()[1]}
    if fraction is not None:  # allowed_memory_maximum as CUDACachingAllocator computes it
        info["memory_limit"] = int(fraction * float(info["total_memory"]))
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump(info, f, indent=1)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--one":
        run_one(sys.argv[2], sys.argv[3])
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    names = sys.argv[2:] or list(FIXTURES)
    rc = 0
    for name in names:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if FIXTURES[name][0]:
            env["PYTORCH_CUDA_ALLOC_CONF"] = FIXTURES[name][0]
        r = subprocess.run([sys.executable, __file__, "--one", name, outdir], env=env)
        print(f"{name}: rc={r.returncode}", flush=True)
        rc |= r.returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()
