#!/usr/bin/env python3
"""Plots the RL co-location experiment (experiments/rl_colocation.yaml): for each model and run,
the device memory over time stacked by tag (rollout weights, KV cache, graph pool, activations;
trainer parameters, gradients, optimizer state, activations, logits, communication buffers,
reference; the caching allocators' cached bytes), with the GPU's capacity and the phases marked.
A separate-GPUs run gets one panel per GPU. Reads DIR/timeseries.csv, DIR/phases.csv and
DIR/summary.json; writes DIR/rl_timeline.png."""
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GIB = float(1 << 30)
COLOURS = {
    "rollout.weights": "#1f77b4", "rollout.kv_cache": "#aec7e8", "rollout.cuda_graph": "#17becf",
    "rollout.activations": "#9edae5", "train.params": "#d62728", "train.grads": "#ff9896",
    "train.optimizer": "#ff7f0e", "train.activations": "#2ca02c", "train.logits": "#98df8a",
    "train.comm": "#9467bd", "train.reference": "#c5b0d5", "allocator_cache": "#c7c7c7",
}


def main():
    dir_ = sys.argv[1]
    with open(os.path.join(dir_, "summary.json")) as f:
        summary = json.load(f)
    capacity = summary.get("capacity_bytes", 0) / GIB
    series = {}  # (model, run, gpu) -> {"t": [...], tag: [...]}
    tags = []
    with open(os.path.join(dir_, "timeseries.csv"), newline="") as f:
        reader = csv.DictReader(f)
        tags = [c for c in reader.fieldnames if c in COLOURS]
        for r in reader:
            s = series.setdefault((r["model"], r["run"], r["gpu"]), {"t": []})
            s["t"].append(float(r["time_s"]))
            for t in tags:
                s.setdefault(t, []).append(int(r[t]) / GIB)
    phases = {}
    with open(os.path.join(dir_, "phases.csv"), newline="") as f:
        for r in csv.DictReader(f):
            phases.setdefault((r["model"], r["run"]), []).append(
                (float(r["start_s"]), r["phase"], int(r["iteration"])))
    models, panels = [], {}
    for run in summary["runs"]:
        if run["model"] not in models:
            models.append(run["model"])
        keys = sorted(k for k in series if k[0] == run["model"] and k[1] == run["label"])
        panels.setdefault(run["model"], []).extend((k, run) for k in keys)
    cols = max((len(v) for v in panels.values()), default=0)
    if cols == 0:  # every run failed before its first sample: say so instead of drawing
        why = "; ".join(f"{r['model']} {r['label']}: {r.get('error') or r.get('oom') or r['outcome']}"
                        for r in summary["runs"]) or "no runs"
        fig, ax = plt.subplots(figsize=(9, 2.5))
        ax.axis("off")
        ax.text(0.5, 0.5, "nothing to draw: no run recorded memory\n" + why, ha="center",
                va="center", wrap=True, fontsize=8)
        out = os.path.join(dir_, "rl_timeline.png")
        fig.savefig(out, dpi=110)
        print(out)
        return
    fig, axes = plt.subplots(len(models) or 1, cols, figsize=(3.6 * cols, 3.6 * max(1, len(models))),
                             squeeze=False, sharey=True)
    for i, model in enumerate(models):
        for j in range(cols):
            ax = axes[i, j]
            if j >= len(panels[model]):
                ax.axis("off")
                continue
            (m, label, gpu), run = panels[model][j]
            s = series[(m, label, gpu)]
            ax.stackplot(s["t"], [s[t] for t in tags], colors=[COLOURS[t] for t in tags],
                         labels=tags, linewidth=0)
            if capacity:
                ax.axhline(capacity, color="red", ls="--", lw=0.8)
            for start, name, it in phases.get((m, label), []):
                if name in ("rollout", "sync"):
                    ax.axvline(start, color="black", lw=0.3, alpha=0.4)
            title = f"{label}" + ("" if gpu == "shared" else f" ({gpu} GPU)")
            if run["outcome"] == "oom":
                title += "\nOOM"
                if s["t"]:
                    ax.plot([s["t"][-1]], [capacity], "rx", ms=10)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("simulated s", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{model}\nGiB", fontsize=9)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.2)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1 if handles else 0, 1, 1))
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8)
    out = os.path.join(dir_, "rl_timeline.png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
