#!/bin/bash
# tools/bench's plots. `tools/bench plot` draws an SVG of every results
# table of docs/benchmarks.md: the same set of files that docs/plots holds,
# each an SVG that names every row of its table and gives each panel a
# title and an axis with its unit, and docs/benchmarks.md
# links each under its table (plot --embed finds nothing to add). A report
# written with --out gets its SVGs beside it and a link under each table.
# The sweep of DRAM against the optimizer state is drawn as lines, raw as
# a flat line. Without matplotlib, plot says so, draws nothing and exits 0.
# Usage: test_bench_plot.sh SOURCE_ROOT
# Exit: 0 pass, 1 fail, 77 skip (no matplotlib for /usr/bin/python3).
set -u
SRC=$1
PY=/usr/bin/python3 # tools/bench's interpreter
. "$(dirname "$0")/lib_scratch.sh" plot
"$PY" -c 'import matplotlib' 2>/dev/null ||
	{ echo "SKIP: no matplotlib (apt-get install python3-matplotlib)"; exit 77; }

# Draw docs/benchmarks.md's tables afresh; compare with what is committed.
"$SRC/tools/bench" plot --plot-dir "$W/plots" >"$W/drawn" 2>"$W/err" || fail "plot: $(cat "$W/err")"
(cd "$W/plots" && ls *.svg) >"$W/new"
(cd "$SRC/docs/plots" && ls *.svg) >"$W/old" 2>/dev/null
[ -s "$W/new" ] || fail "plot drew nothing"
diff "$W/old" "$W/new" >"$W/diff" || fail "docs/plots differs from what plot draws now: $(cat "$W/diff")"

"$PY" - "$SRC" "$W/plots" <<'PY' || fail "the plots do not show their tables"
import os, re, sys, xml.etree.ElementTree as ET
src, plots = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tools"))
import bench_plot
text = open(os.path.join(src, "docs", "benchmarks.md")).read()
drawn, note = bench_plot.plot(text, os.path.join(plots, "again"))
assert note is None, note
links = set(re.findall(r"\]\(plots/([^)]+\.svg)\)", text))
for t, name in drawn:
    root = ET.parse(os.path.join(plots, name)).getroot()
    assert root.tag.endswith("svg"), name
    svg = open(os.path.join(plots, name)).read()
    lines = t.header[0] == "t (s)" or t.header[0].startswith("DRAM / state")
    for row in t.rows if not lines else []:  # bars: each row is named
        want = bench_plot.label(t, row)
        assert want.replace("&", "&amp;") in svg, (name, want)
    for k in bench_plot.measured(t)[:bench_plot.MAX_PANELS] if not lines else []:  # panels
        unit = bench_plot.axis_label(t.header[k])
        assert unit != t.header[k], "%s: no unit for column %r" % (name, t.header[k])
        assert t.header[k].replace("&", "&amp;") in svg and unit in svg, (name, t.header[k], unit)
    assert name in links, "docs/benchmarks.md does not link %s" % name
    after = text.split("\n")[t.end + 1:t.end + 3]
    assert any("(plots/%s)" % name in line for line in after), \
        "%s is not linked under its table (%s)" % (name, t.heading)
missing = links - {name for _, name in drawn}
assert not missing, "linked but not drawn: %s" % sorted(missing)
print("%d plots, each linked under its table" % len(drawn))
PY
mkdir "$W/doc" && cp "$SRC/docs/benchmarks.md" "$W/doc/"
"$SRC/tools/bench" plot --from "$W/doc/benchmarks.md" --plot-dir "$W/doc/plots" --embed \
	>/dev/null 2>&1 || fail "plot --embed failed"
cmp -s "$SRC/docs/benchmarks.md" "$W/doc/benchmarks.md" ||
	fail "docs/benchmarks.md lacks plot links that --embed adds"

# A report written with --out: SVGs beside it, linked under the tables;
# the swap-dram sweep as lines of s/iter over dram / state, raw flat.
mkdir "$W/rep"
cat >"$W/rep/report.md" <<'MD'
# tensorfs benchmark

## swap-dram: swapbench --params 1e8, dram from 0.25 to 1.5 x the optimizer state

| DRAM / state | dram | partitioned s/iter | x raw | pipelined s/iter | x raw |
| ---: | ---: | ---: | ---: | ---: | ---: |
| raw | - | 2.00 | 1.00 | 1.50 | 1.00 |
| 0.25 | 286M | 3.00 | 0.67 | 1.90 | 0.79 |
| 1 | 1144M | 1.50 | 1.33 | 1.20 | 1.25 |

| target | swapper | each repetition |
| --- | --- | --- |
| raw | partitioned | 2.00 |
MD
"$PY" - "$SRC" "$W/rep/report.md" <<'PY' || fail "a report's plots"
import os, sys
src, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tools"))
from benchlib import plot  # tools/bench's package
text = plot.plot_next_to(open(out).read(), out)
svg_name = "report-swap-dram.svg"
svg = os.path.join(os.path.dirname(out), svg_name)
assert os.path.exists(svg), os.listdir(os.path.dirname(out))
assert "![swap-dram: " in text and "](%s)" % svg_name in text, text
body = open(svg).read()
for want in ("DRAM tier / optimizer state", "seconds per iteration",
             "tensorfs, partitioned", "raw disk, pipelined"):
    assert want in body, want
assert len(os.listdir(os.path.dirname(out))) == 2, "the per-repetition table was drawn"
PY

# Without matplotlib: a note, nothing drawn, success.
mkdir -p "$W/nompl/matplotlib"
echo 'raise ImportError("hidden for the test")' >"$W/nompl/matplotlib/__init__.py"
PYTHONPATH="$W/nompl" "$SRC/tools/bench" plot --plot-dir "$W/none" >"$W/out" 2>&1 ||
	fail "plot without matplotlib exited $?: $(cat "$W/out")"
grep -q 'matplotlib is not installed' "$W/out" || fail "no note without matplotlib: $(cat "$W/out")"
[ -e "$W/none" ] && fail "plot without matplotlib drew something"
echo "PASS: plots drawn, linked and up to date"
