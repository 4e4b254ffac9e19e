#!/usr/bin/env python3
"""Plots the RL co-location experiment (experiments/rl_colocation.yaml): for each model, a block of
small stacked-area panels, one per run and GPU role (a co-located run's one GPU; a separate-GPUs
run's rollout GPU and train GPU), of device memory over simulated time in GiB. The tags are
stacked in eight groups (rollout weights, KV cache, graphs + activations + NCCL; trainer parameters +
gradients, optimizer state, activations + logits, communication + reference; the caching
allocators' cached bytes; timeseries.csv keeps every tag), with the GPU's capacity (labelled),
the start of each rollout and weight sync, and a cross where a run ran out of memory. Four panels
a row, 6.8 in (two columns) wide. Reads DIR/timeseries.csv, DIR/phases.csv and DIR/summary.json;
writes DIR/rl_timeline.png and DIR/rl_timeline.svg."""
import csv
import json
import math
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside an installed script
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memsim_plot_style as style  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

GIB = style.GIB
COLS = 4  # panels a row
# (legend label, timeseries.csv tags, colour), bottom of the stack first. Okabe & Ito colours:
# blues for the rollout engine, warm colours and green for the trainer, grey for cached bytes.
GROUPS = [
    ("rollout weights", ["rollout.weights"], "#0072B2"),
    ("rollout KV cache", ["rollout.kv_cache"], "#56B4E9"),
    ("rollout graphs + activations + NCCL",
     ["rollout.cuda_graph", "rollout.activations", "rollout.comm"], "#B9DDF1"),
    ("train params + grads", ["train.params", "train.grads"], "#D55E00"),
    ("train optimizer state", ["train.optimizer"], "#E69F00"),
    ("train activations + logits", ["train.activations", "train.logits"], "#009E73"),
    ("train comm + reference", ["train.comm", "train.reference"], "#CC79A7"),
    ("allocator cache", ["allocator_cache"], "#BBBBBB"),
]
OOM_COLOUR = "#C00000"


def load(dir_):
    with open(os.path.join(dir_, "summary.json")) as f:
        summary = json.load(f)
    series = {}  # (model, run, gpu) -> {"t": [...], group label: [...]} in GiB
    with open(os.path.join(dir_, "timeseries.csv"), newline="") as f:
        reader = csv.DictReader(f)
        present = set(reader.fieldnames or [])
        groups = [(label, [t for t in tags if t in present]) for label, tags, _ in GROUPS]
        for r in reader:
            s = series.setdefault((r["model"], r["run"], r["gpu"]), {"t": []})
            s["t"].append(float(r["time_s"]))
            for label, tags in groups:
                s.setdefault(label, []).append(sum(int(r[t]) for t in tags) / GIB)
    phases = {}
    with open(os.path.join(dir_, "phases.csv"), newline="") as f:
        for r in csv.DictReader(f):
            phases.setdefault((r["model"], r["run"]), []).append((float(r["start_s"]), r["phase"]))
    return summary, series, phases


def panels_per_model(summary, series):
    models, panels = [], {}
    for run in summary["runs"]:
        if run["model"] not in models:
            models.append(run["model"])
        keys = sorted(k for k in series if k[0] == run["model"] and k[1] == run["label"])
        panels.setdefault(run["model"], []).extend((k, run) for k in keys)
    return models, panels


def nothing_to_draw(dir_, summary):
    why = "; ".join(f"{r['model']} {r['label']}: {r.get('error') or r.get('oom') or r['outcome']}"
                    for r in summary["runs"]) or "no runs"
    out = os.path.join(dir_, "rl_timeline")
    style.save(style.nothing_to_draw("nothing to draw: no run recorded memory\n" + why,
                                     style.DOUBLE, 1.6), out)
    print(out + ".png")


def draw_panel(ax, s, run, gpu, capacity, phase_starts):
    layers = [s[label] for label, _, _ in GROUPS]
    # Fewer points that draw the same stack at print size (the total's extremes kept).
    keep = style.decimate_indices(s["t"], [sum(v) for v in zip(*layers)], 800)
    ax.stackplot([s["t"][k] for k in keep], [[layer[k] for k in keep] for layer in layers],
                 colors=[c for _, _, c in GROUPS], linewidth=0)
    for start in phase_starts:
        ax.axvline(start, color="#444444", lw=0.4, alpha=0.5, zorder=1)
    if capacity:
        ax.axhline(capacity, color="black", ls=(0, (4, 2)), lw=0.8)
    title = run["label"] + ("" if gpu == "shared" else f": {gpu} GPU")
    if run["outcome"] == "oom":
        title += " (OOM)"
        if s["t"]:
            ax.plot([s["t"][-1]], [capacity or max(sum(v) for v in zip(
                *[s[label] for label, _, _ in GROUPS]))], marker="X", ms=7,
                color=OOM_COLOUR, markeredgecolor="white", markeredgewidth=0.6, zorder=5,
                clip_on=False)
    ax.set_title(title, fontsize=7, loc="left")
    ax.set_xlim(0, s["t"][-1] if s["t"] and s["t"][-1] > 0 else 1)
    ax.xaxis.set_major_locator(style.MaxNLocator(4, integer=True))
    ax.grid(False, axis="x")
    ax.margins(x=0)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(f"usage: {sys.argv[0]} RESULTS_DIR\n\n{__doc__}")
    dir_ = sys.argv[1]
    summary, series, phases = load(dir_)
    capacity = summary.get("capacity_bytes", 0) / GIB
    models, panels = panels_per_model(summary, series)
    if max((len(v) for v in panels.values()), default=0) == 0:
        nothing_to_draw(dir_, summary)  # every run failed before its first sample: say why
        return
    models = [m for m in models if panels[m]]
    rows = {m: math.ceil(len(panels[m]) / COLS) for m in models}
    row_h, head, legend_h = 1.05, 0.25, 0.45
    heights = [rows[m] * row_h + head for m in models] + [legend_h]
    fig = plt.figure(figsize=(style.DOUBLE, sum(heights) + 0.25), constrained_layout=True)
    subfigs = fig.subfigures(len(models) + 1, 1, height_ratios=heights, squeeze=False)[:, 0]
    top = max(capacity, max((sum(v) for s in series.values()
                             for v in zip(*[s[label] for label, _, _ in GROUPS])), default=0))
    for sf, model in zip(subfigs, models):
        axes = sf.subplots(rows[model], COLS, squeeze=False, sharey=True)
        for k, ax in enumerate(axes.flat):
            if k >= len(panels[model]):
                ax.axis("off")
                continue
            (m, label, gpu), run = panels[model][k]
            starts = [t for t, name in phases.get((m, label), []) if name in ("rollout", "sync")]
            draw_panel(ax, series[(m, label, gpu)], run, gpu, capacity, starts)
            ax.set_ylim(0, top * 1.12)
            ax.yaxis.set_major_locator(style.MaxNLocator(4, integer=True))
            if k == 0 and capacity:
                ax.text(0.02, capacity, f"capacity {capacity:.1f} GiB", fontsize=7, va="bottom",
                        ha="left", transform=ax.get_yaxis_transform())
        sf.suptitle(model, x=0.01, ha="left", fontweight="bold")
        sf.supylabel("device memory (GiB)", fontsize=8)
    subfigs[len(models) - 1].supxlabel("simulated time (s)", fontsize=8)
    handles = [Patch(facecolor=c, label=label) for label, _, c in reversed(GROUPS)]
    handles += [Line2D([], [], color="black", ls=(0, (4, 2)), lw=0.8,
                       label=f"GPU capacity ({capacity:.1f} GiB)"),
                Line2D([], [], color="#444444", lw=0.4, label="rollout / sync start"),
                Line2D([], [], color=OOM_COLOUR, marker="X", ls="none", label="out of memory")]
    leg_ax = subfigs[-1].subplots()
    leg_ax.axis("off")
    leg_ax.legend(handles=handles, loc="center", ncol=4, handlelength=1.6, columnspacing=1.0)
    out = os.path.join(dir_, "rl_timeline")
    style.save(fig, out)
    print(out + ".png")


if __name__ == "__main__":
    main()
