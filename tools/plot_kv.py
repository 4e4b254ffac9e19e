#!/usr/bin/env python3
"""Plots a KV-cache serving experiment (experiments/kv_*.yaml), one colour per run.

Reads DIR/curves.csv (one row per run) and DIR/timeseries.csv (time_s,strategy,metric,value,
recorded on change) written by `memsim --config experiments/kv_<name>.yaml`, and writes:
  DIR/kv_summary.{png,svg}     horizontal bars per run: output tokens/s, max concurrency,
                               KV waste %, TTFT p50/p99, TPOT p50, prefix hit rate %, CoW copies,
                               preemptions, swapped GiB (a panel whose values are all zero is left
                               out, so each experiment shows what it varies);
  DIR/kv_timeseries.{png,svg}  step plots over simulated time: KV used blocks as % of the run's
                               total blocks, running sequences, waiting requests, cumulative
                               preemptions.
"""
import csv
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "memsim"  # fixed SVG ids (not random ones)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

GIB = float(1 << 30)
TICKS = FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}")

# (title, [(curves.csv column, legend label)], scale, value format) for kv_summary.
SUMMARY_PANELS = [
    ("output tokens/s", [("output_tokens_per_s", None)], 1, "{:,.0f}"),
    ("max concurrency (running seqs)", [("max_running_seqs", None)], 1, "{:,.0f}"),
    ("KV waste %", [("kv_waste_pct", None)], 1, "{:.1f}"),
    ("TTFT (ms)", [("ttft_p50_ms", "p50"), ("ttft_p99_ms", "p99")], 1, "{:,.0f}"),
    ("TPOT p50 (ms)", [("tpot_p50_ms", None)], 1, "{:.1f}"),
    ("prefix hit rate %", [("prefix_hit_rate", None)], 100, "{:.1f}"),
    ("CoW copies", [("cow_copies", None)], 1, "{:,.0f}"),
    ("preemptions", [("preemptions", None)], 1, "{:,.0f}"),
    ("swapped GiB", [("swapped_bytes", None)], 1 / GIB, "{:.2f}"),
]

# (metric in timeseries.csv, y label) for kv_timeseries; kv.used_blocks is shown as a percentage.
TIMESERIES_PANELS = [
    ("kv.used_blocks", "KV used blocks (%)"),
    ("running_seqs", "running seqs"),
    ("waiting", "waiting requests"),
    ("preemptions", "preemptions (cum.)"),
]


def number(text):
    try:
        v = float(text)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def experiment_name(dir_):
    """The experiment's name from summary.json (memsim draws in a staging folder whose name is
    not the experiment's); the folder's name when there is none."""
    try:
        with open(os.path.join(dir_, "summary.json")) as f:
            return json.load(f)["experiment"]
    except (OSError, ValueError, KeyError, TypeError):
        return os.path.basename(os.path.normpath(os.path.abspath(dir_)))


def load(dir_):
    paths = [os.path.join(dir_, n) for n in ("curves.csv", "timeseries.csv")]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        sys.exit(f"plot_kv: missing {', '.join(missing)} (run memsim with a kv_*.yaml first)")
    with open(paths[0], newline="") as f:
        runs = list(csv.DictReader(f))
    if not runs:
        sys.exit(f"plot_kv: {paths[0]} has no runs")
    series = {}  # (run, metric) -> ([t], [v])
    with open(paths[1], newline="") as f:
        for r in csv.DictReader(f):
            t, v = series.setdefault((r["strategy"], r["metric"]), ([], []))
            t.append(float(r["time_s"]))
            v.append(float(r["value"]))
    return runs, series


def run_label(r):
    ok = r.get("outcome", "ok") in ("ok", "")
    return r["run"] if ok else f"{r['run']} ({r['outcome']})"


def nothing_to_draw(out_stem, title, why):
    """A figure that says why there is nothing to draw (every run failed, all figures zero)."""
    fig, ax = plt.subplots(figsize=(8, 2.5))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{title}: nothing to draw\n{why}", ha="center", va="center", wrap=True)
    save(fig, out_stem)


def outcomes(runs):
    return "; ".join(f"{r.get('run', '?')}: {r.get('outcome', '?')}" for r in runs) or "no runs"


def plot_summary(runs, title, colors, out_stem):
    panels = []
    for name, cols, scale, fmt in SUMMARY_PANELS:
        values = [[number(r.get(c)) * scale for r in runs] for c, _ in cols]
        if any(v for vs in values for v in vs if not math.isnan(v)):
            panels.append((name, cols, values, fmt))
    if not panels:
        nothing_to_draw(out_stem, title, "every summary figure is zero or missing ("
                        + outcomes(runs) + ")")
        return
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    height = 0.8 + 0.3 * len(runs) * max(len(p[1]) for p in panels)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols + 1.5, height * nrows + 0.8),
                             sharey=True, squeeze=False, constrained_layout=True)
    ys = list(range(len(runs)))
    for ax, (name, cols, values, fmt) in zip(axes.flat, panels):
        width = 0.8 / len(cols)
        for i, ((_, legend), vs) in enumerate(zip(cols, values)):
            off = (i - (len(cols) - 1) / 2) * width
            bars = ax.barh([y + off for y in ys], [0 if math.isnan(v) else v for v in vs],
                           height=width * 0.92, color=colors, label=legend,
                           alpha=1.0 if i == 0 else 0.55, edgecolor="black", linewidth=0.4)
            ax.bar_label(bars, labels=["n/a" if math.isnan(v) else fmt.format(v) for v in vs],
                         padding=2, fontsize=7)
        ax.set_title(name, fontsize=10)
        ax.margins(x=0.22)
        ax.grid(True, axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
        ax.xaxis.set_major_formatter(TICKS)
        if len(cols) > 1:
            ax.legend(fontsize=7, loc="lower right")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    axes[0][0].set_yticks(ys, [run_label(r) for r in runs])
    axes[0][0].invert_yaxis()  # first run on top (shared by every panel)
    fig.suptitle(f"{title}: per-run summary", fontsize=12)
    save(fig, out_stem)


def plot_timeseries(runs, series, title, colors, out_stem):
    if not any(ts for ts, _v in series.values()):
        nothing_to_draw(out_stem, title, "no run recorded a sample (" + outcomes(runs) + ")")
        return
    fig, axes = plt.subplots(len(TIMESERIES_PANELS), 1, figsize=(12, 2.3 * len(TIMESERIES_PANELS)
                                                                 + 0.8),
                             sharex=True, squeeze=False, constrained_layout=True)
    for i, (r, color) in enumerate(zip(runs, colors)):
        name = r["run"]
        # Earlier runs are drawn wider and below, so identical curves still show both colours.
        lw = 1.0 + 1.2 * (len(runs) - 1 - i) / max(1, len(runs) - 1)
        # Hold each run's last values until its end (the last recorded change of any metric).
        end = max((ts[-1] for (run, _), (ts, _v) in series.items() if run == name and ts),
                  default=number(r.get("sim_seconds")))
        total = number(r.get("kv_total_blocks"))
        for ax, (metric, _) in zip(axes[:, 0], TIMESERIES_PANELS):
            ts, vs = series.get((name, metric), ([], []))
            if not ts:
                continue
            if metric == "kv.used_blocks":
                if not total or math.isnan(total):
                    continue
                vs = [100 * v / total for v in vs]
            if not math.isnan(end) and end > ts[-1]:
                ts, vs = ts + [end], vs + [vs[-1]]
            ax.step(ts, vs, where="post", color=color, lw=lw, zorder=2 + i, label=run_label(r))
    for ax, (metric, ylabel) in zip(axes[:, 0], TIMESERIES_PANELS):
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(TICKS)
        if not any(v for (_, m), (_t, vs) in series.items() if m == metric for v in vs):
            ax.text(0.5, 0.5, f"no {ylabel.split(' (')[0]} in any run", transform=ax.transAxes,
                    ha="center", va="center", color="grey")
        if metric == "kv.used_blocks":
            ax.set_ylim(0, 105)
    axes[-1, 0].set_xlabel("simulated time (s)")
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{title}: over time", fontsize=12)
    save(fig, out_stem)


def save(fig, out_stem):
    for ext in ("png", "svg"):
        # No date in the SVG: identical reruns give identical files.
        fig.savefig(f"{out_stem}.{ext}", dpi=120,
                    metadata={"Date": None} if ext == "svg" else None)
    plt.close(fig)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(f"usage: {sys.argv[0]} RESULTS_DIR\n\n{__doc__}")
    dir_ = sys.argv[1]
    runs, series = load(dir_)
    title = experiment_name(dir_)
    cmap = plt.get_cmap("tab10")
    colors = [cmap(i % 10) for i in range(len(runs))]
    plot_summary(runs, title, colors, os.path.join(dir_, "kv_summary"))
    plot_timeseries(runs, series, title, colors, os.path.join(dir_, "kv_timeseries"))


if __name__ == "__main__":
    main()
