#!/usr/bin/env python3
"""Plots the shapes experiment: physical and virtual footprint vs CUDA graphs captured, one line
per strategy (colour, marker and line style each its own), with max(shape) and sum(shape) for
reference, on a log scale when the strategies lie orders of magnitude apart. Lines that lie on
top of each other keep their markers side by side and are named in a note. Reads
DIR/curves.csv and DIR/summary.json written by `memsim --config experiments/shapes.yaml`; writes
DIR/footprint.png and DIR/footprint.svg (and footprint_<variant>.* with --all), 6.8 in wide."""
import argparse
import csv
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside an installed script
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memsim_plot_style as style  # noqa: E402

REFERENCES = [("max(shape)", "max_shape_bytes", (0, (6, 2))),
              ("sum(shape)", "sum_shape_bytes", (0, (1, 1.5)))]


def load(dir_):
    with open(os.path.join(dir_, "curves.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(dir_, "summary.json")) as f:
        summary = json.load(f)
    return rows, summary


def variant_words(variant):
    """weak/fixed/full/persistent -> weak outputs, fixed arrival, full graphs, persistent inputs."""
    parts = variant.split("/")
    if len(parts) != 4:
        return variant
    return ", ".join(f"{p} {w}" for p, w in zip(parts, ("outputs", "arrival", "graphs", "inputs")))


def title_of(summary, variant):
    sizes = summary.get("capture_sizes") or []
    what = f"{len(sizes)} capture sizes {sizes[0]}\u2013{sizes[-1]}" if sizes else "CUDA graphs"
    return f"{summary['model']} on {summary['gpu']}, {what}: {variant_words(variant)}"


def draw_panel(ax, series, refs, idx, unit, log):
    """One panel (idx 1: physical, 2: virtual); returns the coinciding groups it noted."""
    n = len(series)
    for k, (name, s) in enumerate(series.items()):
        st = style.series_style(k, style.staggered(k, n))
        ax.plot(s[0], [v / unit for v in s[idx]], label=name, zorder=3 + n - k, **st,
                **style.marker_face(st["color"]))
    for name, value, ls in refs:
        ax.axhline(value / unit, color=style.GREY, ls=ls, lw=0.9, label=name, zorder=2)
    if log:
        style.log_axis(ax)
    # Which lines coincide (within 0.5%): named in a note, since their markers alone may not say.
    lines = {name: (s[0], s[idx]) for name, s in series.items()}
    lines.update({name: (None, value) for name, value, _ in refs})
    groups = style.coincide_groups(lines)
    if groups:
        style.note(ax, "\n".join(f"{len(g)} lines coincide:\n  " + "\n  ".join(g) for g in groups))
    return groups


def plot_variant(rows, summary, variant, out_stem):
    series = {}
    for r in rows:
        if r["variant"] != variant:
            continue
        s = series.setdefault(r["strategy"], ([], [], []))
        s[0].append(int(r["shapes_captured"]))
        s[1].append(int(r["physical_bytes"]))
        s[2].append(int(r["virtual_bytes"]))
    if not series:
        sys.exit(f"plot_shapes: no curves for variant {variant}")
    ref = next((x for x in summary["references"] if x["variant"] == variant), None)
    refs = [(name, ref[key], ls) for name, key, ls in REFERENCES] if ref else []
    fig, axes, legend_ax = style.figure_legend_below(style.DOUBLE, 3.0, 1, 2, legend_height=0.3)
    panels = ((axes[0, 0], 1, "physical memory"), (axes[0, 1], 2, "virtual memory mapped"))
    for ax, idx, what in panels:
        values = [v for s in series.values() for v in s[idx] if v > 0]
        values += [v for _, v, _ in refs if v > 0]
        top = max(values, default=0)
        unit_name, unit = style.unit_for(top)
        # Log when the curves end more than 10x apart: the lines near max(shape) stay apart.
        ends = [s[idx][-1] for s in series.values() if s[idx] and s[idx][-1] > 0]
        log = bool(ends) and max(ends) > 10 * min(ends)
        draw_panel(ax, series, refs, idx, unit, log)
        ax.set_xlabel("CUDA graphs captured (in each strategy's order)")
        ax.set_ylabel(f"{what} ({unit_name})")
        ax.set_xlim(left=0)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    legend_ax.legend(handles, labels, loc="center", ncol=5, handlelength=3.2)
    fig.suptitle(title_of(summary, variant))
    style.save(fig, out_stem)


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
