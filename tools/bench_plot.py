"""bench_plot.py - SVG charts of tools/bench's markdown tables.

tools/bench prints each matrix as markdown: a heading, then a table of
medians. This reads such markdown, a fresh report or docs/benchmarks.md
with the tables recorded there, and draws one SVG per results table:

- the sweep of DRAM against the optimizer state (swap-dram): seconds per
  iteration against dram / state, one line per swapper, raw as a flat
  line;
- a time series (a first column "t (s)", the soak): one panel per column
  over time;
- any other table with numbers: one panel of bars per measured column,
  a bar per row;
- a table whose only numbers are ratios ("x raw"): one panel of bars per
  ratio, with a line at 1.

Every panel has a title (its column) and its axes their quantity and
unit. Ratio columns beside measured ones, per-repetition tables, tables
without numbers and a table right under a line `<!-- no plot -->` are
left out. matplotlib (Debian: python3-matplotlib) is imported only
when drawing; without it, plot() says why and draws nothing.
"""
import math
import os
import re
import textwrap

SKIP_COLUMNS = ("each repetition", "rep", "step", "condition", "what", "caps")
MAX_PANELS = 6
NO_PLOT = "<!-- no plot -->"
# A column's quantity, by the first of these its header names as a word:
# (unit, axis label).
UNITS = (("MB/s", "MB/s (10^6 bytes per second)"), ("GB/s", "GB/s (10^9 bytes per second)"),
         ("MiB/s", "MiB per second"), ("s/iter", "seconds per iteration"),
         ("requests/GB", "requests per GB"), ("CPU s/GB", "CPU seconds per GB"),
         ("ms a step", "milliseconds per step"), ("ms/step", "milliseconds per step"),
         ("ms", "milliseconds"), ("MiB", "MiB"), ("MB", "MB (10^6 bytes)"),
         ("%", "percent"), ("s", "seconds"), ("hits", "blocks"), ("files", "files"),
         ("/ alone", "ratio, loaded / alone"), ("share / weight", "share of new blocks / share of weight"))


class Table:
    def __init__(self, heading, header, rows, end, skip=False):
        self.heading = heading  # the heading above it, without the #s
        self.header = header    # cell texts
        self.rows = rows        # lists of cell texts
        self.end = end          # index of its last line in the text's lines
        self.skip = skip        # under a NO_PLOT line


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text):
    """Every markdown table of text, with the heading above it."""
    lines = text.split("\n")
    found, heading, i = [], "", 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"#{2,4}\s+(.*)", line)
        if m:
            heading = m.group(1).strip()
        if line.startswith("|") and i + 1 < len(lines) and \
                re.match(r"\|\s*:?-{3,}", lines[i + 1]):
            header = cells(line)
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(cells(lines[j]))
                j += 1
            skip = any(lines[k].strip() == NO_PLOT for k in range(max(0, i - 2), i))
            found.append(Table(heading, header, rows, j - 1, skip))
            i = j
            continue
        i += 1
    return found


def number(text):
    """The number a cell holds ("1191", "0.42", "98.7", "1.0G"), or None."""
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*([KMGT]?)", text.replace(",", ""))
    if not m:
        return None
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return float(m.group(1)) * mult[m.group(2)]


def column_kind(t, k):
    """'num' when most of column k holds numbers, else 'label'."""
    vals = [r[k] for r in t.rows if k < len(r)]
    nums = sum(number(v) is not None for v in vals)
    return "num" if vals and nums * 2 >= len(vals) else "label"


def is_ratio(header):
    """x raw, x s3fs, ...; device bytes / raw is one too."""
    return header.lower().startswith("x ") or header.lower().endswith("/ raw")


def measured(t):
    """Columns to draw: numbers that are not ratios, else the x ones."""
    nums = [k for k, h in enumerate(t.header)
            if column_kind(t, k) == "num" and h.lower() not in SKIP_COLUMNS and k > 0]
    return [k for k in nums if not is_ratio(t.header[k])] or \
        [k for k in nums if t.header[k].lower().startswith("x ")]


def plottable(t):
    low = [h.lower() for h in t.header]
    if t.skip or any(h in SKIP_COLUMNS for h in low) or len(t.rows) < 2 or not t.header[0]:
        return False
    return bool(measured(t))


def axis_label(header):
    """The quantity and unit of a column, from its header."""
    if header.lower().startswith("x "):
        ref = header[2:].split(",")[0]
        return "ratio to %s (above 1: faster than %s)" % (ref, ref)
    for unit, text in UNITS:
        if re.search(r"(?<![\w/])%s(?![\w/])" % re.escape(unit), header):
            return text
    return header


def slug(text):
    """A file name for a heading: its words before a colon, if it has one."""
    s = re.sub(r"[^a-z0-9]+", "-", text.split(":")[0].lower()).strip("-")
    return s[:60].rstrip("-") or "table"


def label(t, row):
    """A row's name: its text cells before the first measured column."""
    first = measured(t)[0]
    return " ".join(row[k] for k in range(min(first, len(row)))
                    if column_kind(t, k) == "label") or row[0]


def cell_value(row, k):
    v = number(row[k]) if k < len(row) else None
    return math.nan if v is None else v


def draw_sweep(plt, t):
    """Seconds per iteration against dram / state; raw is a flat line."""
    fig, ax = plt.subplots(figsize=(6.4, 4))
    cols = [k for k, h in enumerate(t.header) if h.endswith("s/iter")]
    raw = [r for r in t.rows if number(r[0]) is None]
    rest = sorted((r for r in t.rows if number(r[0]) is not None),
                  key=lambda r: number(r[0]))
    xs = [number(r[0]) for r in rest]
    for n, k in enumerate(cols):
        name = t.header[k].replace(" s/iter", "")
        line = ax.plot(xs, [cell_value(r, k) for r in rest], marker="o",
                       label="tensorfs, %s" % name)[0]
        for r in raw:
            ax.axhline(cell_value(r, k), linestyle="--", color=line.get_color(),
                       label="raw disk, %s" % name)
    ax.set_xlabel("DRAM tier / optimizer state")
    ax.set_ylabel("seconds per iteration")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def draw_series(plt, t):
    """One panel per measured column over the first column (time)."""
    cols = measured(t)[:MAX_PANELS]
    fig, axes = plt.subplots(len(cols), 1, figsize=(6.4, 1.6 * len(cols) + 0.6),
                             sharex=True, squeeze=False)
    xs = [cell_value(r, 0) for r in t.rows]
    for ax, k in zip(axes[:, 0], cols):
        ax.plot(xs, [cell_value(r, k) for r in t.rows], marker=".")
        ax.set_title(t.header[k], fontsize=8)
        ax.set_ylabel(axis_label(t.header[k]), fontsize=7)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("time since the start, %s" % axis_label(t.header[0]), fontsize=8)
    return fig


def draw_bars(plt, t):
    """A panel of horizontal bars per measured column, a bar per row."""
    cols = measured(t)[:MAX_PANELS]
    names = [label(t, r) for r in t.rows]
    ncol = min(len(cols), 3)
    nrow = (len(cols) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, squeeze=False,
                             figsize=(3.6 * ncol + 1.6, 0.28 * len(names) * nrow + 1.2 * nrow))
    for n, k in enumerate(cols):
        ax = axes[n // ncol, n % ncol]
        vals = [cell_value(r, k) for r in t.rows]
        ax.barh(range(len(names)), [0 if math.isnan(v) else v for v in vals],
                color=["#888888" if nm.split()[0] == "raw" or nm.endswith(" raw")
                       else "#1f77b4" for nm in names])
        if t.header[k].lower().startswith("x "):
            ax.axvline(1, color="black", linewidth=0.8, linestyle="--")
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names if n % ncol == 0 else [""] * len(names), fontsize=7)
        if n % ncol == 0:
            ax.set_ylabel(" ".join(t.header[c] for c in range(measured(t)[0])
                                   if column_kind(t, c) == "label") or t.header[0], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(t.header[k], fontsize=9)
        ax.set_xlabel(axis_label(t.header[k]), fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(True, axis="x", alpha=0.3)
    for n in range(len(cols), nrow * ncol):
        axes[n // ncol, n % ncol].axis("off")
    return fig


def plot(text, outdir, prefix=""):
    """Draw every results table of text into outdir as PREFIXSLUG.svg.
    Returns (plots, note): plots is a list of (table, file name); note
    says why nothing was drawn (no matplotlib), else it is None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return [], "plots skipped: matplotlib is not installed (%s; Debian: " \
                   "apt-get install python3-matplotlib)" % e
    # the same SVG bytes from the same tables: no date, fixed element ids
    plt.rcParams["svg.hashsalt"] = "tensorfs"
    plt.rcParams["svg.fonttype"] = "none"
    os.makedirs(outdir, exist_ok=True)
    plots, used = [], {}
    for t in tables(text):
        if not plottable(t):
            continue
        name = prefix + slug(t.heading)
        used[name] = used.get(name, 0) + 1
        if used[name] > 1:
            name += "-%d" % used[name]
        if t.header[0].lower().startswith("dram / state"):
            fig = draw_sweep(plt, t)
        elif t.header[0].lower() == "t (s)":
            fig = draw_series(plt, t)
        else:
            fig = draw_bars(plt, t)
        fig.suptitle(textwrap.fill(t.heading, 90), fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, name + ".svg"), format="svg",
                    metadata={"Date": None})
        plt.close(fig)
        plots.append((t, name + ".svg"))
    return plots, None


def embed(text, plots, linkdir):
    """text with an image link after each plotted table, unless the line
    after the table (or after its blank line) already is that link."""
    lines = text.split("\n")
    for t, name in sorted(plots, key=lambda p: p[0].end, reverse=True):
        link = "![%s](%s)" % (t.heading, os.path.join(linkdir, name) if linkdir else name)
        after = lines[t.end + 1:t.end + 3]
        if any(line.startswith("![") and line.endswith("(%s)" % link.split("](")[1][:-1])
               for line in after):
            continue
        lines[t.end + 1:t.end + 1] = ["", link]
    return "\n".join(lines)
