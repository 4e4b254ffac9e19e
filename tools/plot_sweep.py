#!/usr/bin/env python3
"""Plots a sweep (memsim sweep / merge): a metric against one swept key, one line per value of
another, from DIR/sweep.csv. Rows can be narrowed to one value of other keys (--where KEY=VALUE,
repeatable) and to one run of each point (--run LABEL, matched against the run's label, kv or
strategy column). Writes DIR/sweep_<y>_vs_<x>.png and .svg (or --out FILE; a .png also gets its
.svg), 3.3 in (one column) wide; byte columns are drawn in GiB or MiB.

  python3 tools/plot_sweep.py results/sweep_grid-sweep --x requests.arrival.rate \\
      --y output_tokens_per_s --lines kv.block_size --where scheduler.max_num_seqs=256
"""
import argparse
import csv
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside an installed script
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memsim_plot_style as style  # noqa: E402

# Axis labels with units for common columns; any other column is labelled by its name.
LABELS = {
    "requests.arrival.rate": "arrival rate (requests/s)",
    "output_tokens_per_s": "output throughput (tokens/s)",
    "requests_per_s": "throughput (requests/s)",
    "kv.block_size": "KV block size (tokens)",
    "scheduler.max_num_seqs": "max_num_seqs",
    "kv_capacity_tokens": "KV capacity (tokens)",
    "kv_waste_pct": "KV waste (%)",
    "prefix_hit_rate": "prefix hit rate",
    "max_running_seqs": "max running sequences",
    "mean_running_seqs": "mean running sequences",
    "sim_seconds": "simulated time (s)",
}


def number(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def label_of(column, byte_unit=None):
    if column in LABELS:
        return LABELS[column]
    for suffix, unit in (("_ms", "ms"), ("_pct", "%")):
        if column.endswith(suffix):
            return f"{column[:-len(suffix)]} ({unit})"
    if byte_unit:
        return f"{column} ({byte_unit})"
    return column


def is_bytes(column):
    return column.endswith("_bytes") or column.startswith("budget.") and column not in (
        "budget.graph_strategy",)


def agreeing_points(lines, x_name, rel=0.01):
    """A note on the x values where every line has a point and all lie within `rel` of each
    other (their markers overlap there: only the top line shows), or "" when there are none or
    only one line."""
    if len(lines) < 2:
        return ""
    common = sorted(set.intersection(*(set(pts) for pts in lines.values())))
    same = [x for x in common
            if max(pts[x] for pts in lines.values()) - min(pts[x] for pts in lines.values())
            <= rel * max(abs(pts[x]) for pts in lines.values())]
    if not same:
        return ""
    prefix = 0
    while prefix < len(same) and same[prefix] == common[prefix]:
        prefix += 1
    more = len(same) - prefix
    where = (f"for {x_name} \u2264 {style.plain_number(same[prefix - 1])}" if prefix
             else f"at {len(same)} of {len(common)} points")
    if prefix and more:
        where += f" (+{more} point{'s' if more > 1 else ''})"
    return f"{len(lines)} lines within 1% {where}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="the sweep folder (holds sweep.csv)")
    ap.add_argument("--x", required=True, help="swept key on the x axis")
    ap.add_argument("--y", required=True, help="metric column")
    ap.add_argument("--lines", help="key whose values get one line each")
    ap.add_argument("--where", action="append", default=[], help="KEY=VALUE filter (repeatable)")
    ap.add_argument("--run", help="keep rows whose label / kv / strategy equals this")
    ap.add_argument("--out", help="output file (default DIR/sweep_<y>_vs_<x>.png)")
    a = ap.parse_args()
    path = os.path.join(a.dir, "sweep.csv")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        columns = reader.fieldnames or []
    for key in [a.x, a.y] + ([a.lines] if a.lines else []) + [w.split("=", 1)[0] for w in a.where]:
        if key not in columns:
            sys.exit(f"plot_sweep: {path} has no column '{key}' (columns: {', '.join(columns)})")
    for w in a.where:
        k, _, v = w.partition("=")
        rows = [r for r in rows
                if r[k] == v or (number(v) is not None and number(r[k]) == number(v))]
    if a.run:
        rows = [r for r in rows if a.run in (r.get("label"), r.get("kv"), r.get("strategy"))]
    if not rows:
        sys.exit("plot_sweep: no rows left to draw (check --where / --run)")
    groups = {}
    for r in rows:
        groups.setdefault(r[a.lines] if a.lines else "", []).append(r)
    units = {}
    for axis in (a.x, a.y):
        if is_bytes(axis):
            values = [abs(v) for r in rows for v in [number(r[axis])] if v is not None]
            units[axis] = style.unit_for(max(values, default=0))
    scale = {axis: units[axis][1] if axis in units else 1.0 for axis in (a.x, a.y)}
    fig, axes = style.figure(style.SINGLE, 2.5)
    ax = axes[0, 0]
    ordered = sorted(groups.items(),
                     key=lambda kv: (number(kv[0]) is None, number(kv[0]) or 0, kv[0]))
    drawn = {}  # line -> {x: y}
    for i, (name, rs) in enumerate(ordered):
        pts = sorted((number(r[a.x]) / scale[a.x], number(r[a.y]) / scale[a.y]) for r in rs
                     if number(r[a.x]) is not None and number(r[a.y]) is not None)
        if not pts:
            continue
        st = style.series_style(i)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name if a.lines else None,
                zorder=3 + len(ordered) - i, **st, **style.marker_face(st["color"]))
        drawn[name] = dict(pts)
    same = agreeing_points(drawn, label_of(a.x).split(" (")[0])
    ax.set_xlabel(label_of(a.x, units.get(a.x, (None,))[0]))
    ax.set_ylabel(label_of(a.y, units.get(a.y, (None,))[0]))
    style.compact_axis(ax.yaxis)
    title = ", ".join(a.where) or os.path.basename(os.path.normpath(a.dir))
    ax.set_title(title + (f"\n{same}" if same else ""), loc="left", fontsize=7)
    if a.lines:
        ax.legend(title=label_of(a.lines), handlelength=2.8)
    out = a.out or os.path.join(a.dir, f"sweep_{a.y}_vs_{a.x}.png".replace("/", "_"))
    stem, ext = os.path.splitext(out)
    style.save(fig, stem, ("png", "svg") if ext == ".png" else (ext.lstrip(".") or "png",))
    print(out if ext else out + ".png")


if __name__ == "__main__":
    main()
