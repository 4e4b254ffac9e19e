#!/usr/bin/env python3
"""Plots allocator replays (`memsim replay` and experiments/allocators.yaml): for each workload,
reserved (solid) and allocated (dashed) bytes over the ops, one colour per allocator, with what a
recording itself reserved; and the peak reserved bytes per workload and allocator. Reads
DIR/timeseries.csv and DIR/summary.json; writes DIR/allocators.png."""
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = float(1 << 20)


def main():
    dir_ = sys.argv[1]
    series = {}  # workload -> allocator -> (ops, reserved, allocated)
    with open(os.path.join(dir_, "timeseries.csv"), newline="") as f:
        for r in csv.DictReader(f):
            s = series.setdefault(r["workload"], {}).setdefault(r["allocator"], ([], [], []))
            s[0].append(int(r["op"]))
            s[1].append(int(r["reserved_bytes"]) / MIB)
            s[2].append(int(r["allocated_bytes"]) / MIB if r["allocated_bytes"] else None)
    with open(os.path.join(dir_, "summary.json")) as f:
        runs = json.load(f).get("runs", [])
    workloads = sorted(series) or ["(none)"]
    allocators = []
    for r in runs:
        if r["allocator"] not in allocators:
            allocators.append(r["allocator"])
    colour = {a: f"C{k}" for k, a in enumerate(allocators)}
    fig, axes = plt.subplots(len(workloads) + 1, 1, figsize=(11, 4 * (len(workloads) + 1)),
                             constrained_layout=True, squeeze=False)
    for ax, wl in zip(axes[:, 0], workloads):
        if wl not in series:
            ax.text(0.5, 0.5, "nothing to draw: no replayed ops", ha="center")
            continue
        for name, (ops, reserved, allocated) in series[wl].items():
            if name == "recorded":
                ax.plot(ops, reserved, color="black", lw=2.5, alpha=0.3,
                        label="recorded reserved (PyTorch)")
                continue
            ax.plot(ops, reserved, color=colour.get(name, "grey"), lw=1.2,
                    label=f"{name} reserved")
            if any(a is not None for a in allocated):
                ax.plot(ops, allocated, color=colour.get(name, "grey"), lw=0.7, ls="--")
        ax.set_title(f"{wl}: reserved (solid) and allocated (dashed)")
        ax.set_xlabel("op (alloc / free / empty_cache)")
        ax.set_ylabel("MiB")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[-1, 0]
    width = 0.8 / max(1, len(allocators))
    for k, a in enumerate(allocators):
        xs, ys = [], []
        for i, wl in enumerate(workloads):
            r = next((r for r in runs if r["workload"] == wl and r["allocator"] == a), None)
            if r is not None:
                xs.append(i + k * width)
                ys.append(r["peak_reserved_bytes"] / MIB)
        ax.bar(xs, ys, width=width, color=colour[a], label=a)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))])
    ax.set_xticklabels(workloads)
    ax.set_ylabel("peak reserved (MiB)")
    ax.set_title("peak reserved per workload and allocator")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.savefig(os.path.join(dir_, "allocators.png"), dpi=100)


if __name__ == "__main__":
    main()
