#!/usr/bin/env python3
"""Plots allocator replays (`memsim replay` and experiments/allocators.yaml). Top row, one panel
per workload: reserved bytes (solid) and allocated bytes (dashed) over the ops, one colour and
marker per allocator, with what a recording itself reserved (thick grey), on a log scale when the
allocators' peaks lie far apart; lines that coincide are named in a note. Bottom row: the peak
reserved bytes per allocator, each workload on its own scale, with the recording's peak.
A legend explains the line styles (solid: reserved, dashed: allocated) with proxy artists. Reads
DIR/timeseries.csv and DIR/summary.json; writes DIR/allocators.png and DIR/allocators.svg
(6.8 in wide; 3.3 in for one workload)."""
import csv
import json
import math
import textwrap
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside an installed script
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memsim_plot_style as style  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

RECORDED = "recorded"
RECORDED_STYLE = {"color": "#999999", "lw": 3.0, "alpha": 0.55, "solid_capstyle": "butt"}
ALLOCATED_LS = (0, (3, 1.5))
DISPLAY = {}  # run label -> the text drawn for it (display_names)


def load(dir_):
    series = {}  # workload -> allocator -> (ops, reserved, allocated)
    with open(os.path.join(dir_, "timeseries.csv"), newline="") as f:
        for r in csv.DictReader(f):
            s = series.setdefault(r["workload"], {}).setdefault(r["allocator"], ([], [], []))
            s[0].append(int(r["op"]))
            s[1].append(int(r["reserved_bytes"]))
            s[2].append(int(r["allocated_bytes"]) if r["allocated_bytes"] else None)
    with open(os.path.join(dir_, "summary.json")) as f:
        summary = json.load(f)
    return series, summary


def split_label(label):
    """memsim replay's variant label NAME:key=value,key=value -> (NAME, [key=value, ...]); commas
    inside [] or {} belong to a value."""
    name, _, rest = label.partition(":")
    opts, cur, depth = [], "", 0
    for ch in rest:
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            opts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        opts.append(cur)
    return name, opts


def display_names(allocators):
    """The text drawn for each run: memsim replay's variants of one allocator by the options that
    tell them apart (the name alone for one without any); the options all variants of an
    allocator share are returned apart, for a note."""
    parts = {a: split_label(a) for a in allocators}
    groups = {}
    for name, opts in parts.values():
        groups.setdefault(name, []).append(opts)
    shared = {n: [o for o in g[0] if all(o in x for x in g)] for n, g in groups.items()}
    names = {}
    for a, (n, opts) in parts.items():
        own = [o for o in opts if o not in shared[n]]
        names[a] = ", ".join(own) if own and len(groups[n]) > 1 else n if not own else \
            n + ": " + ", ".join(own)
    names = {a: textwrap.fill(t, 34, break_on_hyphens=False, subsequent_indent="  ")
             for a, t in names.items()}
    notes = [f"every {n} run: {', '.join(o)}" for n, o in shared.items() if o]
    return names, notes


def coincide_note(ax, runs):
    """Names the allocators whose reserved lines lie on top of each other (the recording's
    included), in the headroom left at the top of the panel."""
    curves = {DISPLAY.get(name, name).replace("\n  ", " "): (s[0], s[1])
              for name, s in runs.items()}
    groups = style.coincide_groups(curves)
    if len(groups) == 1 and len(groups[0]) == len(curves) > 2:
        style.note(ax, "same reserved: every run", loc="upper left")
    elif groups:
        lines = [textwrap.fill(" = ".join(g), 44, break_on_hyphens=False) for g in groups]
        style.note(ax, "same reserved: " + lines[0]
                   if len(groups) == 1 and len(lines[0]) < 28 else
                   "same reserved:\n" + "\n".join(lines), loc="upper left")


def draw_timeline(ax, wl, runs, allocators, peaks):
    top = max((v for s in runs.values() for v in s[1]), default=0)
    unit_name, unit = style.unit_for(top)
    positive = [p for p in peaks if p > 0]
    log = len(positive) > 1 and max(positive) > 4 * min(positive)
    n = len(allocators)
    hi = max((s[0][-1] for s in runs.values() if s[0]), default=1)
    for name, (ops, reserved, allocated) in runs.items():
        if name == RECORDED:
            xs, ys = style.decimate(ops, reserved, 3000)
            ax.plot(xs, [v / unit for v in ys], zorder=2, **RECORDED_STYLE)
            continue
        i = allocators.index(name) if name in allocators else len(allocators)
        st = style.series_style(i)
        if any(a is not None for a in allocated):
            xs, ys = style.decimate(ops, [0 if a is None else a for a in allocated], 3000)
            ax.plot(xs, [v / unit for v in ys], color=st["color"], lw=0.6, ls=ALLOCATED_LS,
                    zorder=3)
        xs, ys = style.decimate(ops, reserved, 3000)
        ax.plot(xs, [v / unit for v in ys], color=st["color"], lw=1.1, ls="-", zorder=4 + n - i,
                marker=st["marker"], markevery=style.marks_at_x(xs, i, n, 0, hi, 6),
                **style.marker_face(st["color"]))
    if log:
        style.log_axis(ax)
        # From the power of ten below an eighth of the smallest peak; headroom for the note.
        ax.set_ylim(bottom=10 ** math.floor(math.log10(min(positive) / 8 / unit)),
                    top=top / unit * 5)
    else:
        ax.set_ylim(bottom=0, top=top / unit * 1.4)
    ax.set_xlim(0, hi)
    style.compact_axis(ax.xaxis)
    ax.xaxis.set_major_locator(style.MaxNLocator(4))
    ax.set_title(wl, loc="left")
    ax.set_xlabel("op index (alloc / free / empty_cache)")
    ax.set_ylabel(f"bytes ({unit_name}" + (", log scale)" if log else ")"))
    coincide_note(ax, runs)


def draw_peaks(ax, wl, runs_json, allocators, recorded_peak):
    peaks = []
    for a in allocators:
        r = next((r for r in runs_json if r["workload"] == wl and r["allocator"] == a), None)
        peaks.append(r["peak_reserved_bytes"] if r else 0)
    top = max(peaks + [recorded_peak], default=0)
    unit_name, unit = style.unit_for(top)
    long_names = any("\n" in DISPLAY.get(a, a) or len(DISPLAY.get(a, a)) > 18 for a in allocators)
    ys = list(range(len(allocators)))
    if long_names:  # room above each bar for its name's lines
        ys, y = [], -0.5
        for a in allocators:
            y += 0.9 + 0.3 * DISPLAY.get(a, a).count("\n")
            ys.append(y)
    ax.barh(ys, [p / unit for p in peaks], height=0.5 if long_names else 0.65,
            color=[style.series_style(i)["color"] for i in range(len(ys))], edgecolor="none")
    for y, p in zip(ys, peaks):
        ax.text(p / unit, y, " " + style.format_bytes(p), va="center", ha="left", fontsize=7,
                color="#333333")
    if recorded_peak:
        ax.axvline(recorded_peak / unit, color="#555555", lw=0.8, ls=(0, (1, 1)))
        ax.text(recorded_peak / unit, -0.75, "recorded", fontsize=7, ha="center", va="bottom",
                color="#555555")
    if long_names:
        for y, a in zip(ys, allocators):  # long names: above their bars, not in the margin
            ax.text(0, y - 0.27, DISPLAY.get(a, a), fontsize=6.5, va="bottom", ha="left",
                    linespacing=1.0)
        ax.set_yticks(ys, [])
    else:
        ax.set_yticks(ys, allocators)
    ax.set_ylim(ys[-1] + 0.5 if ys else 0.5, -1.0 if recorded_peak else -0.5)
    ax.tick_params(axis="y", length=0)
    ax.grid(False, axis="y")
    ax.margins(x=0.3)
    ax.set_xlim(left=0)
    ax.xaxis.set_major_locator(style.MaxNLocator(4))
    ax.xaxis.set_major_formatter(style.PLAIN)
    ax.set_xlabel(f"peak reserved ({unit_name})")
    return peaks


def legend(legend_ax, allocators, has_recorded, ncol):
    handles = [Line2D([], [], color="black", lw=1.1, label="solid: reserved"),
               Line2D([], [], color="black", lw=0.6, ls=ALLOCATED_LS, label="dashed: allocated")]
    if has_recorded:
        handles.append(Line2D([], [], label="reserved, recorded (PyTorch)", **RECORDED_STYLE))
    for i, a in enumerate(allocators):
        st = style.series_style(i)
        handles.append(Line2D([], [], color=st["color"], marker=st["marker"], lw=1.1,
                              label=DISPLAY.get(a, a),
                              **style.marker_face(st["color"])))
    legend_ax.legend(handles=handles, loc="center", ncol=ncol, handlelength=2.2,
                     columnspacing=1.0)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(f"usage: {sys.argv[0]} RESULTS_DIR\n\n{__doc__}")
    dir_ = sys.argv[1]
    series, summary = load(dir_)
    runs_json = summary.get("runs", [])
    if not series:  # say why instead of drawing empty axes
        why = "; ".join(f"{r.get('workload')} {r.get('allocator')}: {r.get('error') or 'no ops'}"
                        for r in runs_json) or "no runs"
        style.save(style.nothing_to_draw("nothing to draw: no replayed ops\n" + why),
                   os.path.join(dir_, "allocators"))
        return
    workloads = sorted(series)
    allocators = []
    for r in runs_json:
        if r["allocator"] not in allocators:
            allocators.append(r["allocator"])
    recorded_peaks = {w.get("label"): w.get("recorded_peak_reserved_bytes", 0)
                      for w in summary.get("workloads", [])}
    if "snapshot" in summary and "recorded" in summary:  # memsim replay's summary.json
        recorded_peaks["snapshot"] = summary["recorded"].get("peak_reserved_bytes", 0)
    names, shared = display_names(allocators)
    DISPLAY.update(names)
    lines = [n.count("\n") + 1 for n in names.values()]
    long_names = max((len(n) for n in names.values()), default=0) > 18
    cols = len(workloads)
    width = style.SINGLE if cols == 1 else style.DOUBLE
    bars_h = 0.35 + (0.15 * max(1, len(allocators)) if not long_names else
                     sum(0.17 + 0.1 * k for k in lines))
    ncol = (2 if cols == 1 else 4) // (2 if long_names else 1)
    legend_rows = -(-(len(allocators) + 3) // ncol) + (sum(lines) - len(lines) if long_names else 0)
    fig, axes, legend_ax = style.figure_legend_below(
        width, 2.1 + bars_h + 0.15 * legend_rows, 2, cols, legend_height=0.15 * legend_rows)
    if shared:
        fig.suptitle("; ".join(shared), fontsize=7, x=0.02, ha="left")
    has_recorded = False
    for c, wl in enumerate(workloads):
        top, bottom = axes[0, c], axes[1, c]
        has_recorded |= RECORDED in series[wl]
        peaks = draw_peaks(bottom, wl, runs_json, allocators, recorded_peaks.get(wl, 0))
        draw_timeline(top, wl, series[wl], allocators, peaks)
        if c > 0:
            bottom.tick_params(labelleft=False)
    legend(legend_ax, allocators, has_recorded, ncol)
    style.save(fig, os.path.join(dir_, "allocators"))


if __name__ == "__main__":
    main()
