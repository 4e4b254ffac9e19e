"""Plots a KV-cache serving experiment (experiments/kv_*.yaml).

Reads DIR/curves.csv (one row per run) and DIR/timeseries.csv (time_s,strategy,metric,value,
recorded on change) written by `memsim --config experiments/kv_<name>.yaml`, and writes two
figures a paper can use at 6.8 in (two columns) wide:
  DIR/kv_summary.{png,svg}     six panels of horizontal bars, one bar per run: KV capacity
                               (tokens), output throughput, TTFT p50, TPOT p50 and preemptions,
                               then what the experiment varies (CoW copies, prefix hit rate,
                               swapped GiB, KV waste, max running sequences: the first of these
                               that is not zero everywhere). A figure that is zero in every run
                               is left out; every figure stays in curves.csv;
  DIR/kv_timeseries.{png,svg}  step plots over simulated time: KV used blocks as % of the run's
                               total blocks, running sequences, waiting requests, cumulative
                               preemptions; one colour, line style and marker per run,
                               runs whose lines coincide named in a note.
The title is summary.json's "experiment". Runs with nothing to draw still get figures that say why.
"""
import csv
import json
import math
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside an installed script
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memsim_plot_style as style  # noqa: E402

GIB = style.GIB
SUMMARY_PANELS_SHOWN = 6

# (curves.csv column, axis label, scale) for kv_summary, in the order they are picked: the first
# SUMMARY_PANELS_SHOWN that are not zero (or missing) in every run, so the five core figures come
# first and what the experiment varies fills the rest. Latencies are in s when the median is.
SUMMARY_PANELS = [
    ("kv_capacity_tokens", "KV capacity (thousand tokens)", 1e-3),
    ("output_tokens_per_s", "output throughput (tokens/s)", 1),
    ("ttft_p50_ms", "TTFT p50 (ms)", 1),
    ("tpot_p50_ms", "TPOT p50 (ms)", 1),
    ("preemptions", "preemptions", 1),
    ("cow_copies", "CoW block copies", 1),
    ("prefix_hit_rate", "prefix hit rate (%)", 100),
    ("swapped_bytes", "swapped to host (GiB)", 1 / GIB),
    ("kv_waste_pct", "KV waste (%)", 1),
    ("max_running_seqs", "max running sequences", 1),
]

# (metric in timeseries.csv, y label) for kv_timeseries; kv.used_blocks is shown as a percentage.
TIMESERIES_PANELS = [
    ("kv.used_blocks", "KV blocks\nused (%)"),
    ("running_seqs", "running\nsequences"),
    ("waiting", "waiting\nrequests"),
    ("preemptions", "preemptions\n(cumulative)"),
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
    add_deployment_series(series)
    return runs, series


def add_deployment_series(series):
    """Data parallelism: a run's replicas record their gauges as "dpK.<metric>"; the run's own
    series of that metric is their sum at every change (each replica 0 before its first sample),
    as the deployment's total. A run that has its own series keeps it."""
    parts = {}  # (run, metric) -> [(ts, vs) of each replica]
    for (run, metric), tv in series.items():
        m = re.fullmatch(r"dp(\d+)\.(.+)", metric)
        if m:
            parts.setdefault((run, m.group(2)), []).append(tv)
    for key, reps in parts.items():
        if key in series:
            continue
        events = sorted((t, i, v) for i, (ts, vs) in enumerate(reps) for t, v in zip(ts, vs))
        last = [0.0] * len(reps)
        out_t, out_v = [], []
        for t, i, v in events:
            last[i] = v
            if out_t and out_t[-1] == t:
                out_v[-1] = sum(last)
            else:
                out_t.append(t)
                out_v.append(sum(last))
        series[key] = (out_t, out_v)


def run_label(r):
    ok = r.get("outcome", "ok") in ("ok", "")
    return r["run"] if ok else f"{r['run']} ({r['outcome']})"


def nothing_to_draw(out_stem, title, why):
    """A figure that says why there is nothing to draw (every run failed, all figures zero)."""
    style.save(style.nothing_to_draw(f"{title}: nothing to draw\n{why}", style.DOUBLE, 1.4),
               out_stem)


def outcomes(runs):
    return "; ".join(f"{r.get('run', '?')}: {r.get('outcome', '?')}" for r in runs) or "no runs"


def summary_panels(runs):
    """The panels kv_summary shows: [(label, values)], at most SUMMARY_PANELS_SHOWN."""
    panels = []
    for column, label, scale in SUMMARY_PANELS:
        values = [number(r.get(column)) * scale for r in runs]
        if not any(v for v in values if not math.isnan(v)):
            continue  # zero or missing in every run
        known = sorted(v for v in values if not math.isnan(v))
        if label.endswith("(ms)") and known[len(known) // 2] >= 1000:  # most runs wait seconds
            values, label = [v / 1000 for v in values], label.replace("(ms)", "(s)")
        panels.append((label, values))
        if len(panels) >= SUMMARY_PANELS_SHOWN:
            break
    return panels


def plot_summary(runs, title, out_stem):
    panels = summary_panels(runs)
    if not panels:
        nothing_to_draw(out_stem, title, "every summary figure is zero or missing ("
                        + outcomes(runs) + ")")
        return
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    row_h = 0.45 + 0.16 * len(runs)
    fig, axes = style.figure(style.DOUBLE, row_h * nrows + 0.25, nrows, ncols, sharey=True)
    ys = list(range(len(runs)))
    for ax, (label, values) in zip(axes.flat, panels):
        ax.barh(ys, [0 if math.isnan(v) else v for v in values], height=0.62,
                color=style.PALETTE[0], edgecolor="none")
        for y, v in zip(ys, values):  # each value written at its bar's end (n/a: missing)
            ax.text(0 if math.isnan(v) else v, y,
                    " n/a" if math.isnan(v) else " " + style.compact_number(v),
                    va="center", ha="left", fontsize=7, color="#333333")
        ax.set_xlabel(label)
        ax.grid(True, axis="x")
        ax.grid(False, axis="y")
        ax.tick_params(axis="y", length=0)
        style.compact_axis(ax.xaxis)
        ax.xaxis.set_major_locator(style.MaxNLocator(4))
        ax.margins(x=0.25)  # room for the values
        ax.set_xlim(left=0)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    axes[0, 0].set_yticks(ys, [run_label(r) for r in runs])
    axes[0, 0].invert_yaxis()  # first run on top (shared by every panel)
    fig.suptitle(f"{title}: per-run summary")
    style.save(fig, out_stem)


def run_end(series, name, r):
    """A run's end: the last recorded change of any metric (else its simulated seconds)."""
    return max((ts[-1] for (run, _), (ts, _v) in series.items() if run == name and ts),
               default=number(r.get("sim_seconds")))


def plot_timeseries(runs, series, title, out_stem):
    if not any(ts for ts, _v in series.values()):
        nothing_to_draw(out_stem, title, "no run recorded a sample (" + outcomes(runs) + ")")
        return
    n = len(TIMESERIES_PANELS)
    fig, axes, legend_ax = style.figure_legend_below(
        style.DOUBLE, 1.05 * n + 0.3 + 0.16 * math.ceil(len(runs) / 3), n, 1,
        legend_height=0.12 + 0.14 * math.ceil(len(runs) / 3), sharex=True)
    ends = {r["run"]: run_end(series, r["run"], r) for r in runs}
    t_max = max((e for e in ends.values() if not math.isnan(e)), default=0)
    drawn = {}  # metric -> run label -> (ts, vs) as drawn (before decimation)
    for i, r in enumerate(runs):
        name = r["run"]
        st = style.series_style(i)
        # Earlier runs are drawn wider and below, so identical curves still show both.
        lw = 0.9 + 0.8 * (len(runs) - 1 - i) / max(1, len(runs) - 1)
        end = ends[name]
        total = number(r.get("kv_total_blocks"))
        for k, (metric, _) in enumerate(TIMESERIES_PANELS):
            ts, vs = series.get((name, metric), ([], []))
            if not ts:
                continue
            if metric == "kv.used_blocks":
                if not total or math.isnan(total):
                    continue
                vs = [100 * v / total for v in vs]
            if not math.isnan(end) and end > ts[-1]:
                ts, vs = ts + [end], vs + [vs[-1]]
            drawn.setdefault(metric, {})[run_label(r)] = (ts, vs)
            ts, vs = style.decimate(ts, vs, 2400)
            axes[k, 0].plot(ts, vs, drawstyle="steps-post", lw=lw, zorder=2 + i,
                            label=run_label(r),
                            markevery=style.marks_at_x(ts, i, len(runs), 0, t_max, 12),
                            **st, **style.marker_face(st["color"]))
    for k, (metric, ylabel) in enumerate(TIMESERIES_PANELS):
        ax = axes[k, 0]
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(style.PLAIN)
        ax.yaxis.set_major_locator(style.MaxNLocator(4))
        if not any(v for (_, m), (_t, vs) in series.items() if m == metric for v in vs):
            what = ylabel.replace("\n", " ").split(" (")[0]
            ax.text(0.5, 0.5, f"no {what} in any run", transform=ax.transAxes,
                    ha="center", va="center", color="#555555")
            ax.set_ylim(0, 1)
            ax.set_yticks([0])
        else:  # runs whose lines coincide here (same times, values within 0.5%)
            groups = style.coincide_groups(drawn.get(metric, {}))
            if groups:
                style.note(ax, "same: " + "; ".join(" = ".join(g) for g in groups))
        if metric == "kv.used_blocks":
            ax.set_ylim(0, 105)
        if k < n - 1:
            ax.tick_params(labelbottom=False)
    axes[n - 1, 0].set_xlabel("simulated time (s)")
    axes[0, 0].set_xlim(left=0)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        legend_ax.legend(handles, labels, loc="center", ncol=min(3, len(handles)),
                         handlelength=3.2)
    fig.suptitle(f"{title}: over time")
    style.save(fig, out_stem)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(f"usage: {sys.argv[0]} RESULTS_DIR\n\n{__doc__}")
    dir_ = sys.argv[1]
    runs, series = load(dir_)
    title = experiment_name(dir_)
    plot_summary(runs, title, os.path.join(dir_, "kv_summary"))
    plot_timeseries(runs, series, title, os.path.join(dir_, "kv_timeseries"))


if __name__ == "__main__":
    main()
