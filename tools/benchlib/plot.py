"""plot.py: SVGs of the reports' tables (tools/bench plot, --out).

bench_plot (tools/bench_plot.py) draws; plot_next_to puts a report's SVGs
beside it and links them; plot_main draws docs/benchmarks.md's tables.
"""

import bench_plot
import os

from .runner import REPO, log

MATRIX = "plot"
SUMMARY = "draw the tables of docs/benchmarks.md as SVGs"

HELP = """\
plots: with --out FILE, an SVG of each results table goes next to FILE
(FILE's name without .md, a dash, the table's heading), and the report
links it under the table; `tools/bench plot` draws the tables recorded in
docs/benchmarks.md (--from FILE) into docs/plots/ (--plot-dir DIR), and
with --embed adds the missing links to the file. matplotlib is needed
(Debian: python3-matplotlib); without it the plots are skipped, with a
note.
"""

TOOLS = []
TARGETS = []
DEFAULT_REPS = 1


def add_options(p):
    p.add_argument("--from", dest="plot_from",
                   default=os.path.join(REPO, "docs", "benchmarks.md"),
                   metavar="FILE",
                   help="plot: the markdown whose tables to draw (default "
                        "docs/benchmarks.md)")
    p.add_argument("--plot-dir", default=os.path.join(REPO, "docs", "plots"),
                   metavar="DIR",
                   help="plot: where the SVGs go (default docs/plots)")
    p.add_argument("--embed", action="store_true",
                   help="plot: link each SVG under its table in --from")


def plot_next_to(text, out):
    """Draw the report's tables as SVGs next to out; link them in text."""
    base = os.path.splitext(os.path.basename(out))[0]
    plots, note = bench_plot.plot(text, os.path.dirname(os.path.abspath(out)),
                                  base + "-")
    if note:
        log(note)
        return text
    log("plots: %s" % ", ".join(name for _, name in plots))
    return bench_plot.embed(text, plots, "")


def plot_main(args):
    """tools/bench plot: draw the tables of --from into --plot-dir."""
    with open(args.plot_from) as f:
        text = f.read()
    plots, note = bench_plot.plot(text, args.plot_dir)
    if note:
        log(note)
        return 0
    for _, name in plots:
        print(os.path.join(args.plot_dir, name))
    if args.embed:
        link = os.path.relpath(args.plot_dir, os.path.dirname(os.path.abspath(
            args.plot_from)))
        new = bench_plot.embed(text, plots, link)
        if new != text:
            with open(args.plot_from, "w") as f:
                f.write(new)
            log("linked the plots in %s" % args.plot_from)
    return 0
