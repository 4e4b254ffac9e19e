"""The house style of memsim's plots (tools/plot_*.py): figures a paper can use as they are.

- Sizes: a column is 3.3 in wide (SINGLE), a page 6.8 in (DOUBLE); text is 8 pt (ticks and
  legends 7 pt), so a figure printed at its own width is readable without scaling.
- Series: a colour-blind-safe palette (Okabe & Ito, 7 colours) with a marker (8) and a line
  style (5) per series, cycled independently: the first 5 series differ in all three, the first
  7 in colour and marker, and no two of the first 280 share colour, marker and style. Markers
  sit at different offsets along each line (`markevery`), so lines that lie on top of each
  other still show each series' markers.
- Units as written: 1 GiB = 2^30 bytes, 1 MiB = 2^20 bytes; never "GB" for GiB.
- No chart junk: no top/right spines, a light grid, frameless legends, constrained layout.
- Output: PNG at 300 dpi and SVG; fixed SVG ids and no date in the SVG, so identical reruns give
  identical files (tests/test_reruns.sh compares them byte for byte).

The plot scripts import it from their own folder:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import memsim_plot_style as style
"""
import bisect
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import Formatter, FuncFormatter, MaxNLocator  # noqa: E402,F401

SINGLE = 3.3  # in: one column
DOUBLE = 6.8  # in: both columns
DPI = 300
GIB = float(1 << 30)
MIB = float(1 << 20)

# Okabe & Ito, "Color Universal Design" (yellow left out: too light for lines on white).
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINESTYLES = ["-", (0, (4, 1.5)), (0, (1, 1.2)), (0, (5, 1.5, 1, 1.5)), (0, (2.5, 1, 1, 1, 1, 1))]
GREY = "#7f7f7f"

RC = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "figure.titlesize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "legend.frameon": False,
    "legend.handlelength": 2.6,
    "legend.borderaxespad": 0.3,
    "legend.columnspacing": 1.2,
    "axes.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "axes.titlepad": 3,
    "axes.labelpad": 2,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.4,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
    "xtick.minor.size": 1.5,
    "ytick.minor.size": 1.5,
    "xtick.major.pad": 2,
    "ytick.major.pad": 2,
    "lines.linewidth": 1.0,
    "lines.markersize": 3.5,
    "patch.linewidth": 0.5,
    "hatch.linewidth": 0.5,
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    "figure.constrained_layout.h_pad": 0.02,
    "figure.constrained_layout.w_pad": 0.02,
    "svg.hashsalt": "memsim",  # fixed SVG ids (not random ones)
    "svg.fonttype": "path",    # text as outlines: the SVG looks the same without the fonts
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}
matplotlib.rcParams.update(RC)


def series_style(i, markevery=None):
    """Colour, marker and line style of series i (see the module's note on uniqueness)."""
    s = {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)],
         "linestyle": LINESTYLES[i % len(LINESTYLES)]}
    if markevery is not None:
        s["markevery"] = markevery
    return s


def staggered(i, n, marks=8):
    """markevery for series i of n: about `marks` markers per line, evenly spaced along it (in
    display distance), each series starting at its own offset so that coinciding lines show
    every series' markers side by side."""
    step = 1.0 / marks
    return (step * ((i % max(1, n)) + 0.5) / max(1, n), step)


def marks_at_x(xs, i, n, lo, hi, marks=10):
    """markevery (a list of indices) for series i of n over x range [lo, hi]: the points nearest
    `marks` evenly spaced x positions, shifted by (i + 0.5) / n of a spacing per series. For
    noisy or stepped lines, where spacing along the line (staggered) would crowd the markers."""
    if not xs or hi <= lo:
        return None
    dx = (hi - lo) / marks
    out = []
    for k in range(marks):
        x = lo + dx * (k + (i % max(1, n) + 0.5) / max(1, n))
        if x > xs[-1]:
            break
        j = min(len(xs) - 1, bisect.bisect_left(xs, x))
        if not out or out[-1] != j:
            out.append(j)
    return out


def marker_face(color):
    """Hollow-looking markers (white face) keep overlapping markers apart."""
    return {"markerfacecolor": "white", "markeredgecolor": color, "markeredgewidth": 0.8}


def figure(width=DOUBLE, height=2.4, nrows=1, ncols=1, **kw):
    """A figure of `width` inches (SINGLE or DOUBLE) with constrained layout."""
    kw.setdefault("squeeze", False)
    return plt.subplots(nrows, ncols, figsize=(width, height), constrained_layout=True, **kw)


def legend_axes(fig, gridspec_cell):
    """An empty axes (no frame, no ticks) in `gridspec_cell` that holds a figure's legend, so
    that constrained layout makes room for it (matplotlib 3.6 has no 'outside' legends)."""
    ax = fig.add_subplot(gridspec_cell)
    ax.axis("off")
    return ax


def figure_legend_below(width, height, nrows, ncols, legend_height=0.35, **kw):
    """A figure of nrows x ncols axes (returned as a 2-D array) with a row below them for a
    legend spanning every column: (fig, axes, legend_ax). legend_height is in inches."""
    fig = plt.figure(figsize=(width, height), constrained_layout=True)
    plot_h = max(0.5, height - legend_height)
    gs = fig.add_gridspec(nrows + 1, ncols,
                          height_ratios=[plot_h / nrows] * nrows + [legend_height])
    axes = [[None] * ncols for _ in range(nrows)]
    for r in range(nrows):
        for c in range(ncols):
            share = {}
            if kw.get("sharey") and c > 0:
                share["sharey"] = axes[r][0]
            if kw.get("sharex") and r > 0:
                share["sharex"] = axes[0][c]
            axes[r][c] = fig.add_subplot(gs[r, c], **share)
    return fig, _Grid(axes), legend_axes(fig, gs[nrows, :])


class _Grid:
    """axes[r, c] over a list of lists (like plt.subplots(squeeze=False))."""

    def __init__(self, rows):
        self.rows = rows

    def __getitem__(self, rc):
        r, c = rc
        return self.rows[r][c]

    @property
    def flat(self):
        return [a for row in self.rows for a in row]


def unit_for(max_bytes):
    """("GiB", 2^30) when the largest value is at least 1 GiB, else ("MiB", 2^20)."""
    return ("GiB", GIB) if max_bytes >= GIB else ("MiB", MIB)


def format_bytes(b):
    """An exact-unit label: 730.0 MiB, 14.12 GiB."""
    if abs(b) >= GIB:
        return f"{b / GIB:.2f} GiB"
    if abs(b) >= MIB:
        return f"{b / MIB:.1f} MiB"
    return f"{b / 1024:.1f} KiB" if abs(b) >= 1024 else f"{b:.0f} B"


def plain_number(v, _pos=None):
    """Tick labels without scientific notation: 1,000 and 0.5 (and 0.01 on log axes)."""
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


PLAIN = FuncFormatter(plain_number)


def compact_number(v, _pos=None):
    """Short labels for wide ranges: 0.5, 950, 26,876, 225k, 6.37M."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e5:
        return f"{v / 1e3:.3g}k"
    if a >= 100 or v == 0:
        return f"{v:,.0f}"
    return f"{v:.3g}"


class _Compact(Formatter):
    """Tick labels with one suffix for the whole axis (0, 40k, 80k, 120k; 0, 2M, 4M), chosen
    from the largest tick; plain numbers below 100,000."""

    def __init__(self):
        self.scale, self.suffix = 1.0, ""

    def set_locs(self, locs):
        super().set_locs(locs)
        top = max((abs(v) for v in locs), default=0)
        self.scale, self.suffix = ((1e6, "M") if top >= 1e6 else (1e3, "k") if top >= 1e5
                                   else (1.0, ""))

    def __call__(self, v, pos=None):
        if self.suffix:
            return "0" if v == 0 else f"{v / self.scale:g}{self.suffix}"
        return plain_number(v)


def compact_axis(axis):
    """Compact tick labels on one axis (ax.xaxis or ax.yaxis); a formatter per axis."""
    axis.set_major_formatter(_Compact())


def log_axis(ax, axis="y"):
    """A log scale whose ticks read as plain numbers (0.1, 1, 10), not 10^k."""
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_formatter(PLAIN)
    a.set_minor_formatter(FuncFormatter(lambda *_: ""))


def coincide_groups(series, rel=0.005):
    """Groups (lists of names, in input order) of series that lie on top of each other: the same
    x values and y values within `rel` of the larger one at every point. `series` maps
    name -> (xs, ys); a name with xs None is a constant (a reference line at ys)."""
    names = list(series)
    seen, groups = set(), []
    for i, a in enumerate(names):
        if a in seen:
            continue
        group = [a]
        for b in names[i + 1:]:
            if b not in seen and _same(series[a], series[b], rel):
                group.append(b)
        if len(group) > 1:
            seen.update(group)
            groups.append(group)
    return groups


def _close(u, v, rel):
    return abs(u - v) <= rel * max(abs(u), abs(v)) or (u == v)


def _same(a, b, rel):
    (xa, ya), (xb, yb) = a, b
    if xa is None and xb is None:
        return _close(ya, yb, rel)
    if xa is None or xb is None:  # a constant against a line: the line is flat at it
        xs, ys = (xb, yb) if xa is None else (xa, ya)
        c = ya if xa is None else yb
        return len(ys) > 0 and all(_close(y, c, rel) for y in ys)
    return (len(xa) == len(xb) and list(xa) == list(xb)
            and all(_close(u, v, rel) for u, v in zip(ya, yb)))


def note(ax, text, loc="best"):
    """A small note placed where it covers the least data (a legend made of one text line)."""
    h = Line2D([], [], linestyle="none")
    leg = ax.legend([h], [text], loc=loc, handlelength=0, handletextpad=0, borderpad=0.3,
                    fontsize=7, labelcolor="#333333")
    ax.add_artist(leg)
    return leg


def decimate(xs, ys, max_points=2000):
    """At most about `max_points` points that draw the same line at print resolution: the
    x range is cut into max_points/4 equal bins, and each keeps its first, lowest, highest and
    last point (spikes and steps stay; files stay small). xs must be sorted."""
    idx = decimate_indices(xs, ys, max_points)
    return [xs[k] for k in idx], [ys[k] for k in idx]


def decimate_indices(xs, ys, max_points=2000):
    """The indices decimate() keeps (use them for several series that share one x, such as the
    layers of a stacked area, with ys their total)."""
    n = len(ys)
    if n <= max_points or xs[-1] <= xs[0]:
        return list(range(n))
    bins = max(1, max_points // 4)
    width = (xs[-1] - xs[0]) / bins
    out, lo = [], 0
    while lo < n:
        edge = xs[lo] + width
        hi = lo + 1
        while hi < n and xs[hi] < edge:
            hi += 1
        idx = {lo, hi - 1}
        seg = range(lo, hi)
        if any(ys[k] is not None and not _isnan(ys[k]) for k in seg):
            idx.add(min(seg, key=lambda k: _key(ys[k], 1)))
            idx.add(max(seg, key=lambda k: _key(ys[k], -1)))
        out.extend(sorted(idx))
        lo = hi
    return out


def _isnan(v):
    return isinstance(v, float) and math.isnan(v)


def _key(v, sign):
    return math.inf * sign if v is None or _isnan(v) else v


def nothing_to_draw(text, width=SINGLE, height=1.2):
    """A figure that says why there is nothing to draw."""
    fig, ax = plt.subplots(figsize=(width, height))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=8,
            transform=ax.transAxes)
    return fig


def save(fig, stem, formats=("png", "svg")):
    """Writes STEM.png (300 dpi) and STEM.svg; returns the paths. No date in the SVG and fixed
    ids: identical reruns give identical files."""
    paths = []
    for ext in formats:
        path = f"{stem}.{ext}"
        meta = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(ext)
        fig.savefig(path, dpi=DPI, metadata=meta)
        paths.append(path)
    plt.close(fig)
    return paths
