#!/usr/bin/env python3
"""Plots a sweep (memsim sweep / merge): a metric against one swept key, one line per value of
another, from DIR/sweep.csv. Rows can be narrowed to one value of other keys (--where KEY=VALUE,
repeatable) and to one run of each point (--run LABEL, matched against the run's label, kv or
strategy column). Writes DIR/sweep_<y>_vs_<x>.png (or --out FILE).

  python3 tools/plot_sweep.py results/sweep_grid-sweep --x requests.arrival.rate \\
      --y output_tokens_per_s --lines kv.block_size --where scheduler.max_num_seqs=256
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def number(s):
    try:
        return float(s)
    except ValueError:
        return None


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
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rs in sorted(groups.items(), key=lambda kv: (number(kv[0]) is None, number(kv[0]) or 0, kv[0])):
        pts = sorted((number(r[a.x]), number(r[a.y])) for r in rs
                     if number(r[a.x]) is not None and number(r[a.y]) is not None)
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                label=f"{a.lines}={name}" if a.lines else None)
    ax.set_xlabel(a.x)
    ax.set_ylabel(a.y)
    title = ", ".join(a.where) or os.path.basename(os.path.normpath(a.dir))
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if a.lines:
        ax.legend(fontsize=8)
    out = a.out or os.path.join(a.dir, f"sweep_{a.y}_vs_{a.x}.png".replace("/", "_"))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
