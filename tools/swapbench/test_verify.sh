#!/bin/sh
# test_verify.sh - swapbench's own checks pass on a healthy folder.
#
# Runs swapbench at a small size with both swappers, 1 and 4 threads (with
# hidden size 800 and 4 threads, thread slices start on 1 KiB boundaries),
# parameters on NVMe, 2 ranks, and the activations workload.  Each run must
# exit 0, report verify.errors == 0 and checked_bytes > 0, each rank's
# steady median iteration time (none above the slowest's), and leave the
# files DeepSpeed leaves, with the sizes DeepSpeed gives them; with --trace,
# the log of the phases follows the swapper's order.
#
# SWAPBENCH: the binary.  SWAPBENCH_TARGET: the folder to test (default: a
# new one under ${TMPDIR:-/var/tmp}); a fresh subfolder is made in it.
# Exit status: 0 pass, 1 fail, 77 skip.

set -u
: "${SWAPBENCH:=swapbench}"
base=${SWAPBENCH_TARGET:-${TMPDIR:-/var/tmp}}
small="--params 2e7 --sub-group-size 5e6 --iters 3"

command -v python3 >/dev/null 2>&1 || { echo "skip: python3 not found"; exit 77; }
. "$(dirname "$0")/test_lib.sh"
make_work verify

fail=0

# check NAME DIR KIND THREADS RANKS EXTRA: the report (every byte planned was
# moved, and checked without error) and the files left.
check() {
	python3 - "$@" "$work/out.json" <<'EOF'
import json, os, re, sys

name, d, kind, threads, ranks, extra, report = sys.argv[1:]
threads, ranks = int(threads), int(ranks)
r = json.load(open(report))
v = r["verify"]
assert r["exit_status"] == 0, r["exit_status"]
assert v["errors"] == 0, v
assert v["checked_bytes"] > 0, v
assert len(r["iterations"]) == r["config"]["iters"], r["iterations"]
c = r["config"]
for it in r["iterations"]:
    assert it["read_gbps"] > 0 and it["write_gbps"] > 0, it
    # each rank's own time; the iteration's is the slowest rank's
    rt = it["rank_total_s"]
    assert len(rt) == ranks and min(rt) > 0 and abs(max(rt) - it["total_s"]) < 1e-6, it
    assert it["write_bytes"] == c["write_bytes_per_iter"], (it, c)
    if kind == "zero" and it["iter"] == 1:
        # m and v are not read before they first exist
        assert 0 < it["read_bytes"] < c["read_bytes_per_iter"], (it, c)
    else:
        assert it["read_bytes"] == c["read_bytes_per_iter"], (it, c)
# each rank's own steady median, and the slowest over the fastest less one
st = r["steady"]
rs = st.get("rank_median_total_s")
assert isinstance(rs, list) and len(rs) == ranks and min(rs) > 0, st
assert max(rs) <= st["median_total_s"] + 1e-9, st
assert abs(st["rank_spread"] - (max(rs) / min(rs) - 1)) < 1e-6, st

def files(sub):
    p = os.path.join(d, sub)
    return sorted(os.listdir(p)) if os.path.isdir(p) else []

if kind == "zero":
    for rank in range(ranks):
        opt = files("zero_stage_3/optimizer/rank%d" % rank)
        groups = [f for f in opt if re.fullmatch(r"\d+_\d+\.tensor\.swp", f)]
        grads = [f for f in opt if re.fullmatch(r"\d+_\d+_gradient_\d+_\d+\.tensor\.swp", f)]
        assert groups, opt
        assert grads, opt
        for g in groups:
            assert "exp_avg-" + g in opt and "exp_avg_sq-" + g in opt, g
        assert len(opt) == 3 * len(groups) + len(grads), opt
        assert len(opt) * ranks == r["config"]["files"] - r["config"]["param_files"] * ranks
        for f in opt:
            size = os.path.getsize(os.path.join(d, "zero_stage_3/optimizer/rank%d" % rank, f))
            assert size % (1024 * threads) == 0, (f, size)
            m = re.fullmatch(r"\d+_\d+_gradient_\d+_(\d+)\.tensor\.swp", f)
            assert not m or int(m.group(1)) * 4 == size, (f, size)
        params = files("zero_stage_3/fp16params/rank%d" % rank)
        if extra == "params":
            assert params and all(re.fullmatch(r"\d+_param\.tensor\.swp", f) for f in params)
            assert len(params) == r["config"]["param_files"], params
        else:
            assert not params, params
else:
    act = files("activations/rank0")
    layers = r["config"]["layers"]
    want = [] if extra == "delete" else ["mb0_layer%d.act" % i for i in range(layers)]
    assert sorted(act) == sorted(want), act
EOF
}

# check_trace SWAPPER RANKS: --trace's lines, against the report's config:
# per rank and iteration, forward and backward, each subgroup's phases in
# order, then end; times that never go back.
check_trace() {
	python3 - "$@" "$work/trace" "$work/out.json" <<'EOF'
import json, sys

swapper, ranks, trace, report = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = json.load(open(report))["config"]
groups, iters = c["subgroups"], c["iters"]
assert c["swapped_subgroups"] == groups, c
per = {}
for line in open(trace):
    t, rank, it, what, g = line.split()
    per.setdefault((int(rank), int(it)), []).append((float(t), what, int(g)))
assert sorted(per) == [(r, i) for r in range(ranks) for i in range(iters + 1)], sorted(per)
if swapper == "partitioned":
    steps = [(w, g) for g in range(groups)
             for w in ("read_state", "read_grads", "compute", "write_state")]
else:
    steps = [(w, g) for g in range(groups) for w in ("wait_read", "compute", "wait_write")]
    steps.append(("wait_write", groups))
for (rank, it), lines in per.items():
    assert [t for t, _, _ in lines] == sorted(t for t, _, _ in lines), (rank, it)
    got = [(w, g) for _, w, g in lines]
    want = [("init", 0)] if it == 0 else \
        [("forward", 0), ("backward", 0)] + steps + [("end", groups)]
    assert got == want, (rank, it, got, want)
EOF
}

# run NAME KIND THREADS RANKS EXTRA ARGS...
run() {
	name=$1 kind=$2 threads=$3 ranks=$4 extra=$5
	shift 5
	dir="$work/$name"
	mkdir "$dir"
	"$SWAPBENCH" --json "$@" "$dir" >"$work/out.json" 2>"$work/err.txt"
	st=$?
	if [ "$st" -ne 0 ]; then
		echo "FAIL $name: exit status $st"
		cat "$work/err.txt"
		fail=1
		return
	fi
	if ! check "$name" "$dir" "$kind" "$threads" "$ranks" "$extra"; then
		echo "FAIL $name: bad report or layout"
		fail=1
		return
	fi
	case " $* " in
	*" --trace "*)
		swapper=partitioned
		case " $* " in *" pipelined "*) swapper=pipelined ;; esac
		if ! check_trace "$swapper" "$ranks"; then
			echo "FAIL $name: bad --trace lines"
			fail=1
			return
		fi
		;;
	esac
	echo "ok   $name"
	rm -rf "$dir"
}

# shellcheck disable=SC2086 # $small is a list of options
{
	run partitioned-t1 zero 1 1 - $small --trace "$work/trace"
	run pipelined-t1 zero 1 1 - $small --swapper pipelined --trace "$work/trace"
	run partitioned-t4-params zero 4 1 params $small --threads 4 --hidden 800 --offload-params
	run pipelined-t4-nooverlap zero 4 1 - $small --threads 4 --hidden 800 \
		--swapper pipelined --no-overlap-events --single-submit --queue-depth 4
	run ranks2 zero 1 2 - $small --ranks 2 --trace "$work/trace"
	run act-delete act 1 1 delete --workload activations --iters 3 --layers 4 \
		--micro-batches 3 --act-size 8M
	run act-overwrite act 4 1 overwrite --workload activations --iters 3 --layers 4 \
		--micro-batches 3 --act-size 5000K --threads 4 --act-reuse overwrite
}

exit $fail
