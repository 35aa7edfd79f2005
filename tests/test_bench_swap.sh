#!/bin/bash
# tools/bench swap's counters and command line. After each iteration the
# mount's stats are snapshotted (by swapbench --between, and after the
# last one by tools/bench): the devices' bytes, and the prefetches issued
# and late. The report gives, per steady iteration (3..N), the devices'
# bytes over the raw folder's, and the late prefetches over those issued,
# in all the steady iterations and in the last two (where the cycle's
# window has settled).
#   1. On snapshots written here, the parsing and the sums come out as
#      worked by hand: a snapshot with a missing column is dropped, and too
#      few iterations give no figure rather than a wrong one.
#      The swap matrices need no fio; the fio matrix does.
#      `tools/bench swap --help` is short and names swap's options only;
#      `tools/bench --help` lists the matrices in a few lines. An option
#      of another matrix (`swap --size`, `fio --params`) is refused,
#      naming the matrices that take it. (Regression: it was accepted and
#      ignored, so a run measured something else than asked.)
#   2. As root, with /dev/fuse: a small matrix (192 MB of state read and
#      written per iteration over dram=96M, about twice) on a real mount,
#      with fio nowhere on PATH, prints both tables: the devices moved
#      under 0.8 of the raw folder's bytes (0.69-0.70 here, 0.72-0.77
#      since the prefetch window covers the reader's aio queue, whose six
#      slots of 96 the cycle no longer keeps; writing every byte back
#      would be 1), and prefetches were issued, no more late than
#      issued. With --iters 3 (the default; iteration 3 is the one steady
#      iteration the snapshots cover) both tables are printed too.
#      --swap-dram 64M, below the daemon's minimum, stops before the first
#      turn with the daemon's message.
# Usage: test_bench_swap.sh SOURCE_ROOT BUILD_ROOT
# Exit: 0 pass, 1 fail; part 2 is left out (and said so) without root or
# /dev/fuse.
set -u
SRC=$1
BUILD=$2
PY=/usr/bin/python3 # tools/bench's interpreter
. "$(dirname "$0")/lib_scratch.sh" bench-swap

echo "1. the snapshots' sums"
"$PY" - "$SRC" "$W" <<'PY' || fail "the snapshots' sums"
import os, sys

sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
from benchlib import cli, swap as bench  # tools/bench's package

snaps = os.path.join(sys.argv[2], "snaps")


def rows_of(text):
    with open(snaps, "w") as f:
        f.write(text)
    rows = bench.read_snaps(snaps)
    assert not os.path.exists(snaps), "read_snaps left its file"
    return rows


# After iterations 1..5 of 6: bytes, issued, late. A torn line is dropped.
rows = rows_of("100 10 9\n300 30 20\n450 50 25\n12 13\n600 80 28\n760 110 30\n")
assert rows == [[100, 10, 9], [300, 30, 20], [450, 50, 25], [600, 80, 28],
                [760, 110, 30]], rows
# Steady iterations 3, 4, 5 moved 150, 150, 160 bytes; raw moves 100 + 200.
share = bench.steady_device_share(rows, (100, 200))
assert abs(share - 0.5) < 1e-9, share
# Prefetches: 3..5 issued 110 - 30 = 80, late 30 - 20 = 10; the last two
# (4 and 5) issued 110 - 50 = 60, late 30 - 25 = 5.
got = bench.steady_prefetch_late(rows)
assert got == (80, 10, 60, 5), got
assert bench.late_share(10, 80) == "10/80 (12%)", bench.late_share(10, 80)
assert bench.late_share(0, 0) == "0/0 (-)", bench.late_share(0, 0)
# Three snapshots (a run of 3 iterations) cover iteration 3 alone.
rows = rows_of("100 10 9\n300 30 20\n450 50 25\n")
assert bench.steady_prefetch_late(rows) == (20, 5, 20, 5), bench.steady_prefetch_late(rows)
# Two snapshots say nothing of a steady iteration.
rows = rows_of("100 10 9\n300 30 20\n")
assert bench.steady_prefetch_late(rows) is None
assert bench.steady_device_share(rows, (100, 200)) is None
assert bench.steady_device_share(rows_of("1 2 3\n4 5 6\n7 8 9\n"), (None, 200)) is None
assert rows_of("not a number\n") == []
print("   bytes share 0.5; late 10/80 over 3..5 and 5/60 over the last two")
# The slowest rank of each steady iteration (2 on): rank 1 in 2 of 3, two
# ranks ever; iteration 1 (rank 0 slowest) is not steady.
its = [{"iter": 1, "rank_total_s": [3.0, 1.0, 1.0]},
       {"iter": 2, "rank_total_s": [1.0, 2.0, 1.5]},
       {"iter": 3, "rank_total_s": [1.0, 1.2, 1.9]},
       {"iter": 4, "rank_total_s": [1.0, 1.3, 1.1]}]
got = bench.slowest_ranks(its, 2)
assert got == (2, 3, 2), got
assert bench.slowest_ranks([{"iter": 2}], 2) is None  # an older swapbench
assert bench.slowest_ranks(its[:1], 2) is None
print("   the slowest rank of each steady iteration: 2 of 3, 2 ranks ever")
for m in ("swap", "swap-dram", "swap-remote", "learner"):
    assert "fio" not in cli.tools_needed(m), (m, cli.tools_needed(m))
for m in ("fio", "all", "tiers", "latency", "dedup"):
    assert "fio" in cli.tools_needed(m), (m, cli.tools_needed(m))
print("   fio is needed by fio, all, tiers, latency and dedup, not by the swap matrices")
PY

"$PY" "$SRC/tools/bench" swap --help >"$W/help" 2>&1 || fail "tools/bench swap --help: $(cat "$W/help")"
for o in --params --sub-group-size --swap-dram --iters --targets --reps --tensorfs-base; do
	grep -q -- "$o" "$W/help" || fail "tools/bench swap --help lacks $o"
done
for o in --size --tier-bw --tier-dram --lat-size --s3-size --cache-dram --cycle-mults \
	--learn-params --dedup-size --dram-fractions --swap-remote-params --plot-dir; do
	grep -q -- "$o" "$W/help" && fail "tools/bench swap --help names $o, not a swap option"
done
n=$(wc -l <"$W/help")
[ "$n" -le 80 ] || fail "tools/bench swap --help is $n lines"
"$PY" "$SRC/tools/bench" --help >"$W/help" 2>&1 || fail "tools/bench --help: $(cat "$W/help")"
for m in fio swap swap-dram all tiers latency swap-remote s3 cycle scan learner dedup plot; do
	grep -qE "^  $m +[a-zA-Z]" "$W/help" || fail "tools/bench --help does not list $m"
done
n=$(wc -l <"$W/help")
[ "$n" -le 50 ] || fail "tools/bench --help is $n lines"
echo "   tools/bench swap --help: swap's options only; tools/bench --help: $n lines"
for c in "swap --size 1G:--size is not an option of swap (only of fio, tiers)" \
	"fio --params=2e8:--params is not an option of fio (only of swap)" \
	"swap --cache-dram 1G:--cache-dram is not an option of swap (only of cycle, scan, dedup)" \
	"swap --cache-dr 1G:--cache-dram is not an option of swap (only of cycle, scan, dedup)"; do
	read -ra words <<<"${c%%:*}"
	rc=0
	"$PY" "$SRC/tools/bench" "${words[@]}" --dir /nonexistent >"$W/foreign" 2>&1 || rc=$?
	[ $rc -eq 2 ] || fail "tools/bench ${c%%:*}: exit $rc, want 2 (a refused option): $(cat "$W/foreign")"
	grep -qF -- "${c#*:}" "$W/foreign" || fail "tools/bench ${c%%:*}: $(cat "$W/foreign")"
done
echo "   an option of another matrix is refused, naming the matrices that take it"

echo "2. a small matrix on a real mount"
if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/fuse ]; then
	echo "   left out: needs root (tools/bench drops the host's caches) and /dev/fuse"
	echo "PASS: bench-swap (part 1)"
	exit 0
fi
mkdir "$W/bench" "$W/bin"
# PATH without fio: every program of PATH but fio, linked into one folder.
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
	for f in "$d"/*; do
		[ -x "$f" ] && [ "${f##*/}" != fio ] && [ ! -e "$W/bin/${f##*/}" ] && ln -s "$f" "$W/bin/"
	done
done
PATH="$W/bin" command -v fio >/dev/null && fail "fio is still on the test's PATH"
bench() { # ITERS DRAM OUT
	(cd "$SRC" && PATH="$W/bin" "$PY" tools/bench swap --targets raw,tfs \
		--tensorfs "$BUILD/fs/tensorfs" --swapbench "$BUILD/tools/swapbench/swapbench" \
		--params 1.2e7 --sub-group-size 3e6 --iters "$1" --swap-dram "$2" --reps 1 \
		--dir "$W/bench" >"$3" 2>"$3.err")
}
bench 6 96M "$W/out" || fail "tools/bench swap without fio on PATH: $(tail -n 5 "$W/out.err")"
echo "   ran with fio absent from PATH"
report() { # OUT MAX_SHARE
	"$PY" - "$@" <<'PY' || fail "the report: $(cat "$1")"
import re, sys

text = open(sys.argv[1]).read()
for swapper in ("partitioned", "pipelined"):
    m = re.search(r"^\| tfs \| %s \| ([0-9.]+) \| ([0-9.]+) \|$" % swapper, text, re.M)
    assert m, "no device-bytes row for " + swapper
    share = float(m.group(1))
    # The state is about twice the DRAM tier: near half the raw folder's bytes.
    assert 0 < share < float(sys.argv[2]), "device bytes / raw %s for %s" % (share, swapper)
    m = re.search(r"^\| tfs \| %s \| (\d+)/(\d+) \([0-9%%-]+\) \| (\d+)/(\d+) \([0-9%%-]+\) \|$"
                  % swapper, text, re.M)
    assert m, "no late-prefetch row for " + swapper
    late, issued, late2, issued2 = map(int, m.groups())
    assert issued > 0, "no prefetches issued in the steady iterations (%s)" % swapper
    assert late <= issued and late2 <= issued2 <= issued, m.group(0)
    print("   %s: device bytes / raw %.2f, late %d/%d, last two %d/%d"
          % (swapper, share, late, issued, late2, issued2))
PY
}
report "$W/out" 0.8
echo "   --iters 3"
bench 3 96M "$W/out3" || fail "tools/bench swap --iters 3: $(tail -n 5 "$W/out3.err")"
# Iteration 3 alone, the first after the learner's two: the tables are
# there and their figures sane (not yet near the steady state's share).
report "$W/out3" 2

echo "3. a dram below the daemon's minimum stops the run before any turn"
bench 3 64M "$W/out64" && fail "tools/bench swap --swap-dram 64M succeeded"
grep -q "dram=64M is too small" "$W/out64.err" ||
	fail "no daemon's message for --swap-dram 64M: $(tail -n 5 "$W/out64.err")"
grep -q "^bench: rep " "$W/out64.err" && fail "--swap-dram 64M ran a turn: $(grep "^bench: rep " "$W/out64.err")"
echo "   $(grep -m1 "dram=64M is too small" "$W/out64.err" | sed 's/^bench: *| *//')"
echo "PASS: bench-swap"
