#!/usr/bin/env python3
"""Plots the shapes experiment: physical and virtual footprint vs shapes captured, one line per
strategy, with max(shape) and sum(shape) for reference. Reads DIR/curves.csv and
DIR/summary.json written by `memsim --config experiments/shapes.yaml`; writes
DIR/footprint.png and DIR/footprint.svg (and footprint_<variant>.* with --all)."""
import argparse
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "memsim"  # fixed SVG ids (not random ones)
import matplotlib.pyplot as plt  # noqa: E402

GIB = float(1 << 30)


def load(dir_):
    with open(os.path.join(dir_, "curves.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(dir_, "summary.json")) as f:
        summary = json.load(f)
    return rows, summary


def plot_variant(rows, summary, variant, out_stem):
    series = {}
    for r in rows:
        if r["variant"] != variant:
            continue
        s = series.setdefault(r["strategy"], ([], [], []))
        s[0].append(int(r["shapes_captured"]))
        s[1].append(int(r["physical_bytes"]) / GIB)
        s[2].append(int(r["virtual_bytes"]) / GIB)
    if not series:
        sys.exit(f"plot_shapes: no curves for variant {variant}")
    ref = next((x for x in summary["references"] if x["variant"] == variant), None)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    for ax, idx, title in ((axes[0], 1, "physical"), (axes[1], 2, "virtual (mapped)")):
        for name, s in series.items():
            ax.plot(s[0], s[idx], marker=".", markersize=3, label=name)
        if ref:
            ax.axhline(ref["max_shape_bytes"] / GIB, color="black", ls="--", lw=1,
                       label="max(shape)")
            ax.axhline(ref["sum_shape_bytes"] / GIB, color="grey", ls=":", lw=1,
                       label="sum(shape)")
        ax.set_xlabel("shapes captured")
        ax.set_ylabel("GiB")
        ax.set_title(f"{title} footprint")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{summary['model']} on {summary['gpu']}: CUDA-graph memory ({variant})")
    for ext in ("png", "svg"):
        # No date in the SVG: identical reruns give identical files.
        fig.savefig(f"{out_stem}.{ext}", dpi=120,
                    metadata={"Date": None} if ext == "svg" else None)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir")
    ap.add_argument("--variant", help="variant to plot (default: the table variant)")
    ap.add_argument("--all", action="store_true", help="also plot every variant")
    args = ap.parse_args()
    rows, summary = load(args.dir)
    variant = args.variant or summary["table_variant"]
    plot_variant(rows, summary, variant, os.path.join(args.dir, "footprint"))
    if args.all:
        for v in sorted({r["variant"] for r in rows}):
            plot_variant(rows, summary, v,
                         os.path.join(args.dir, "footprint_" + v.replace("/", "_")))


if __name__ == "__main__":
    main()
