#!/usr/bin/env python3
"""Plots `memsim replay`: reserved (solid) and allocated (dashed) bytes over the replayed ops,
one colour per allocator, with what the recording itself reserved. Reads DIR/timeseries.csv;
writes DIR/replay.png."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = float(1 << 20)


def main():
    dir_ = sys.argv[1]
    series = {}
    with open(os.path.join(dir_, "timeseries.csv"), newline="") as f:
        for r in csv.DictReader(f):
            s = series.setdefault(r["allocator"], ([], [], []))
            s[0].append(int(r["op"]))
            s[1].append(int(r["reserved_bytes"]) / MIB)
            s[2].append(int(r["allocated_bytes"]) / MIB if r["allocated_bytes"] else None)
    fig, ax = plt.subplots(figsize=(11, 5), constrained_layout=True)
    if not series:
        ax.text(0.5, 0.5, "nothing to draw: the trace has no ops", ha="center")
    for k, (name, (ops, reserved, allocated)) in enumerate(sorted(series.items())):
        if name == "recorded":
            ax.plot(ops, reserved, color="black", lw=2.5, alpha=0.35,
                    label="recorded reserved (PyTorch)")
            continue
        colour = f"C{k}"
        ax.plot(ops, reserved, color=colour, lw=1.2, label=f"{name} reserved")
        if any(a is not None for a in allocated):
            ax.plot(ops, allocated, color=colour, lw=0.8, ls="--", label=f"{name} allocated")
    ax.set_xlabel("op (alloc / free / empty_cache)")
    ax.set_ylabel("MiB")
    ax.set_title("memsim replay: reserved and allocated memory per allocator")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.savefig(os.path.join(dir_, "replay.png"), dpi=110)


if __name__ == "__main__":
    main()
