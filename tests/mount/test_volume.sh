#!/bin/bash
# What reaches the devices: byte counts from /.tensorfs/stats, which no
# timing noise moves. Each part fails when the DRAM tier does not save the
# device traffic it should.
#
#   1. Lazy write-back: a file rewritten while it stays in DRAM is never
#      written to a device; fsync writes it once; unlinking a dirty file
#      writes nothing.
#   2. The age limit (dirty_expire_ms) writes back a block dirty that long
#      and makes it durable: it survives kill -9 without an fsync.
#   3. Activation offloading (swapbench --workload activations) that fits
#      in DRAM writes 0 bytes to the devices: every file dies in DRAM, and
#      the learner forgets each (learner.files).
#   4. Cyclic reads, default options (prefetch and readahead on): 16 files
#      read in order over DRAM a quarter of their size read at most 0.8 of
#      the data from the devices per pass (Belady's optimum is 0.75, LRU's
#      1.0): prefetch and readahead must do no harm.
#   5. swapbench, optimizer state twice the DRAM tier: the devices move at
#      most 0.6 of what the raw folder moves (the state read plus the state
#      written) per steady iteration (4 and 5), with either swapper. Plain
#      LRU, or writing back every write, moves about 1.0; the optimum is
#      about 0.5. The pipelined swapper moved 0.57-0.61 before blocks
#      streaming through were written back at once (0.51-0.52 since, and
#      0.55-0.58 with the prefetch window covering swapbench's aio queue:
#      16 slots the cycle no longer keeps).
#      The blocks that stay in DRAM are spread over every state file,
#      rather than whole files kept (spread_check), and leave the blocks
#      streaming through a write-back depth of slots (stream_check).
#   6. A file overwritten whole without being read (no cycle learned) is
#      written back from dirty_background_bytes on, below the dirty limit,
#      and no further than that mark.
#   7. The learner keeps the cycle with two ranks swapping at once
#      (swapbench --ranks 2), whose files interleave differently each
#      iteration, and with the parameters swapped too (--offload-params):
#      the bound of 5 (0.64 with the parameters); and with eight ranks
#      of 18 subgroups each, each rank's folder learned apart: at most
#      0.75 (one sequence: 0.98).
#   8. The cycle's prefetch window grows while the devices idle between
#      the reads (swapbench --compute-ms: the optimizer's compute): the
#      first pass that wants more (16 prefetches or more, a tenth or more
#      late, the busiest device in flight under half of it) grows it, in
#      counts from the debug log's line per pass, whatever the machine's
#      speed. The lines chain the window from its first depth through the
#      depths the stats showed, with the rises that cover the readers'
#      queue (four of them) between passes.
#   9. An fsync finds its blocks behind more dirty blocks than the flusher
#      walks (4096), and writes back those, and only those.
#  10. A cycle of more uses than the learner's ring first keeps: 6000
#      small files read in turn over DRAM a third of their size. It is
#      learned, and each pass reads at most 0.8 of the data from the
#      devices (2Q, without the cycle: 1.0).
. "$(dirname "$0")/lib.sh"

: "${SWAPBENCH:?SWAPBENCH must name the swapbench binary}"

# dev_bytes FIELD: FIELD (read_bytes or write_bytes) summed over the devices.
dev_bytes() {
	python3 - "$MNT/.tensorfs/stats" "$1" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
print(sum(t[sys.argv[2]] for name, t in st["tiers"].items() if name != "dram"))
PY
}

MiB=$((1024 * 1024))

echo "1. lazy write-back"
TFS_DRAM=256M TFS_THREADS=4 tfs_mount
for r in 1 2 3; do
	dd if=/dev/urandom of="$MNT/hot" bs=1M count=16 conv=notrunc status=none || fail "write $r"
done
cp "$MNT/hot" "$T/hot.ref"
w=$(dev_bytes write_bytes) || fail "stats"
[ "$w" -eq 0 ] || fail "a file rewritten in DRAM was written back: $w bytes"
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); os.fsync(fd)' "$MNT/hot" ||
	fail "fsync"
w=$(dev_bytes write_bytes)
[ "$w" -eq $((16 * MiB)) ] || fail "fsync of 16 MiB wrote $w bytes"
dd if=/dev/urandom of="$MNT/dead" bs=1M count=32 status=none || fail "write dead"
rm "$MNT/dead" || fail "unlink"
dd if=/dev/urandom of="$MNT/trunc" bs=1M count=8 status=none || fail "write trunc"
truncate -s 0 "$MNT/trunc" || fail "truncate"
w2=$(dev_bytes write_bytes)
[ "$w2" -eq "$w" ] || fail "dead data was written back: $((w2 - w)) bytes"
tfs_umount || fail "unmount"
TFS_DRAM=256M TFS_THREADS=4 tfs_mount
cmp "$MNT/hot" "$T/hot.ref" || fail "the rewritten file differs after remount"
tfs_umount || fail "unmount"
echo "   rewrites stayed in DRAM; fsync wrote 16 MiB once; dead data wrote nothing"

echo "2. the age limit"
TFS_DRAM=256M TFS_THREADS=4 tfs_mount "dirty_expire_ms=500"
dd if=/dev/urandom of="$MNT/aged" bs=1M count=8 status=none || fail "write aged"
cp "$MNT/aged" "$T/aged.ref"
ok=0
for i in $(seq 1 300); do
	# written back by age, committed, and a sync point past the commit
	if [ "$(dev_bytes write_bytes)" -ge $((8 * MiB)) ] &&
		[ "$(tfs_stat_json cache dirty_bytes)" -eq 0 ] &&
		[ "$(tfs_stat_json cache unsynced_blocks)" -eq 0 ]; then
		ok=1
		break
	fi
	sleep 0.05
done
[ "$(tfs_stat_json cache expired_bytes)" -ge $((8 * MiB)) ] ||
	fail "the write-back was not counted as the age limit's"
[ $ok -eq 1 ] || fail "8 MiB dirty for longer than dirty_expire_ms=500 were not written back and synced within 15 s"
tfs_kill9
TFS_DRAM=256M TFS_THREADS=4 tfs_mount
cmp "$MNT/aged" "$T/aged.ref" || fail "data older than the age limit was lost at kill -9"
tfs_umount || fail "unmount"
echo "   written back and durable without fsync; survived kill -9"

echo "3. activations within DRAM"
TFS_DRAM=256M TFS_THREADS=8 tfs_mount
"$SWAPBENCH" -d "$MNT" --workload activations --layers 8 --act-size 4M --micro-batches 4 \
	--iters 3 >"$T/act.out" 2>&1 || { cat "$T/act.out"; fail "swapbench activations"; }
w=$(dev_bytes write_bytes)
[ "$w" -eq 0 ] || fail "activations that fit in DRAM wrote $w bytes to the devices"
# 96 files made and deleted: the learner keeps no record of any of them.
kept=$(tfs_stat_json learner files)
[ "$kept" -eq 0 ] || fail "the learner keeps $kept records of deleted activation files"
tfs_umount || fail "unmount"
echo "   0 bytes written to the devices; no record kept of the deleted files"

echo "4. cyclic reads with prefetch and readahead on"
FILES=16
BLOCKS=64 # MiB per file: 1 GiB against 256 MiB of DRAM
TFS_DRAM=256M TFS_THREADS=4 tfs_mount
for i in $(seq 1 $FILES); do
	dd if=/dev/urandom of="$MNT/c$i" bs=1M count=$BLOCKS status=none || fail "write c$i"
done
tfs_umount || fail "unmount"
TFS_DRAM=256M TFS_THREADS=4 tfs_mount
read_pass() {
	local i
	for i in $(seq 1 $FILES); do
		dd if="$MNT/c$i" of=/dev/null bs=1M iflag=direct status=none || fail "read c$i"
	done
}
for p in 1 2 3; do read_pass; done # the learner's passes
[ "$(tfs_stat_json learner cycle_files)" -eq $FILES ] || fail "no cycle of $FILES files learned"
r0=$(dev_bytes read_bytes)
read_pass
read_pass
r1=$(dev_bytes read_bytes)
ratio=$(python3 -c "import sys; print('%.3f' % ((int(sys.argv[2]) - int(sys.argv[1])) / (2 * $FILES * $BLOCKS * $MiB)))" "$r0" "$r1")
late=$(tfs_stat_json prefetch late)
issued=$(tfs_stat_json prefetch issued)
tfs_umount || fail "unmount"
echo "   device bytes read per pass / data: $ratio (Belady 0.75, LRU 1.0); prefetch late $late of $issued"
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 0.8 else 1)" "$ratio" ||
	fail "cyclic reads read $ratio of the data per pass, more than 0.8"

echo "5. swapbench at twice the DRAM tier"
# swapbench_volume SWAPPER [ARGS...]: device bytes per steady iteration / the
# raw folder's; ARGS go to swapbench.
swapbench_volume() {
	local swapper=$1
	shift
	rm -rf "$NVME" "$META" && mkdir -p "$NVME" # a new store each time
	TFS_DRAM=256M TFS_THREADS=8 tfs_mount
	cat >"$T/snap.sh" <<EOF
python3 -c 'import json,sys; st=json.load(open("$MNT/.tensorfs/stats")); print(sum(t["read_bytes"]+t["write_bytes"] for n,t in st["tiers"].items() if n!="dram")); print(st["learner"]["cycle_bytes"], file=open("$T/cycles", "a"))' >>"$T/snaps"
EOF
	: >"$T/snaps"
	: >"$T/cycles"
	"$SWAPBENCH" -d "$MNT" --params 3.2e7 --sub-group-size 8e6 --iters 6 --swapper "$swapper" "$@" \
		--between "sh $T/snap.sh" --json >"$T/sb.json" 2>"$T/sb.err" ||
		{ cat "$T/sb.err"; fail "swapbench $swapper"; }
	# Each state file's share in DRAM (user.tensorfs.tiers), and the learner's
	# and the cache's view of the cycle, for spread_check.
	python3 - "$MNT" >"$T/spread" <<'PY'
import json, os, sys
root = sys.argv[1]
st = json.load(open(os.path.join(root, ".tensorfs", "stats")))
print(st["learner"]["cycle_bytes"], st["cache"]["kept_bytes"], st["cache"]["kept_evicted_bytes"])
for d, _, names in os.walk(os.path.join(root, "zero_stage_3")):
	for n in names:
		p = os.path.join(d, n)
		size = os.path.getsize(p)
		if size >= 16 << 20:  # the optimizer's state; gradients are smaller
			t = json.loads(os.getxattr(p, "user.tensorfs.tiers"))
			print(n, size, "%.2f" % (t.get("dram", 0) / size))
PY
	tfs_umount || fail "unmount"
	python3 - "$T/sb.json" "$T/snaps" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))["config"]
raw = cfg["read_bytes_per_iter"] + cfg["write_bytes_per_iter"]
s = [int(x) for x in open(sys.argv[2]).read().split()]
# snapshots after iterations 1 to 5 (and at the end, after swapbench's own
# checks); the learner has the cycle from iteration 2 on: 4 and 5 are steady
per = [(s[i + 1] - s[i]) / raw for i in (2, 3)]
print("%.3f" % (sum(per) / len(per)), " ".join("%.3f" % ((s[i + 1] - s[i]) / raw) for i in range(len(s) - 1)))
PY
}
# spread_check SWAPPER: the cycle is larger than DRAM, so the blocks that
# stay are spread over every state file: the median file keeps 0.3-0.8 of
# its bytes in DRAM, and fewer than one in four keep under 0.15. Not every
# file keeps its share: the file in use at the end holds more (its blocks
# stream through), and when no block that does not stay is clean (their
# write-backs still in flight), eviction takes blocks that stay
# (cache.kept_evicted_bytes, printed), more of them the slower the daemon.
# In the sanitizer's build, one file once held 0.11 and another 1.00; in
# another run four of twelve held 0.16, 0.19, 0.89 and 1.00, the median
# 0.57. Keeping whole files, the earlier policy, left most files at
# 0.00-0.14 (the median among them) and the rest at 0.78-1.00. The
# learner counts every file's size in the cycle's bytes (a file last
# written, not read, once counted as its first write's end).
spread_check() {
	python3 - "$T/spread" "$1" <<'PY' || fail "$1: the blocks that stay are not spread over the state files"
import sys
lines = open(sys.argv[1]).read().split("\n")
cycle, kept, lost = map(int, lines[0].split())
files = [l.split() for l in lines[1:] if l]
state = sum(int(f[1]) for f in files)
shares = [float(f[2]) for f in files]
print("   %s: cycle %d MiB (state files %d MiB), %d MiB kept (%d MiB of it evicted); DRAM share per file %s"
      % (sys.argv[2], cycle >> 20, state >> 20, kept >> 20, lost >> 20, " ".join(f[2] for f in files)))
ok = len(files) >= 8 and cycle >= state and kept > 0
mid = sorted(shares)[len(shares) // 2 - 1:len(shares) // 2 + 1]
ok = ok and 0.3 <= sum(mid) / 2 <= 0.8 and 4 * sum(x < 0.15 for x in shares) < len(shares)
sys.exit(0 if ok else 1)
PY
}
# stream_check SWAPPER: with a cycle larger than DRAM, what stays leaves the
# blocks streaming through a write-back depth (queue_depth, 32 blocks) of
# slots beside the clean reserve and the prefetch window: at most 224 of
# the 256 MiB stay. With 8 slots streaming, a writer of the next phase
# waited for each write-back in turn (at dram=200M, under one write in
# flight in /proc/diskstats; docs/benchmarks.md).
stream_check() {
	local kept
	kept=$(head -1 "$T/spread" | cut -d' ' -f2)
	[ "$kept" -le $(((256 - 32) * MiB)) ] ||
		fail "$1: $((kept / MiB)) of 256 MiB stay, leaving the write-back fewer than 32 slots"
}
# The pipelined swapper's two streams reach the files in an order that
# varies from one iteration to the next: it moves a few points more.
for sw in partitioned:0.6 pipelined:0.6; do
	out=$(swapbench_volume "${sw%%:*}") || fail "swapbench ${sw%%:*}"
	v=${out%% *}
	echo "   ${sw%%:*}: device bytes per steady iteration / raw folder's: $v (iterations 2 on: ${out#* })"
	python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$v" "${sw#*:}" ||
		fail "${sw%%:*}: the devices moved $v of the raw folder's volume, more than ${sw#*:}"
	spread_check "${sw%%:*}"
	stream_check "${sw%%:*}"
done
echo "6. background write-back of a blind overwrite"
# Writers wait at dirty_limit_bytes. A file overwritten whole without
# being read (fio's overwrite; no cycle learned) streams: the flusher
# writes back its oldest blocks from dirty_background_bytes on, so that a
# writer held at the limit finds the device queues full. Overwritten 16
# blocks past that mark (the age limit off), it writes back exactly those
# 16 and keeps the rest dirty in DRAM.
TFS_DRAM=256M TFS_THREADS=4 tfs_mount "dirty_expire_ms=0"
lim=$(tfs_stat_json cache dirty_limit_bytes) || fail "stats: no dirty_limit_bytes"
bg=$(tfs_stat_json cache dirty_background_bytes) || fail "stats: no dirty_background_bytes"
[ $((bg + 16 * MiB)) -lt "$lim" ] || fail "no room for 16 blocks between $bg and $lim"
n=$((bg / MiB + 16))
# Each step is bounded: a writer that waits on the dirty limit forever is
# the bug this would show, with the daemon's stacks (seen once in CI, a
# 600 s timeout in this part, not since).
within 120 dd if=/dev/urandom of="$MNT/bg" bs=1M count=$n status=none ||
	{ tfs_stacks; fail "write bg (124: not done in 120 s)"; }
within 120 "$TFSCTL" -m "$MNT" evict "$MNT/bg" >/dev/null ||
	{ tfs_stacks; fail "tfsctl evict (124: not done in 120 s)"; }
w0=$(dev_bytes write_bytes)
[ "$w0" -eq $((n * MiB)) ] || fail "evict of $n MiB wrote $w0 bytes"
[ "$(tfs_stat_json cache dirty_bytes)" -eq 0 ] || fail "dirty after evict"
dd if=/dev/urandom of="$T/bg.ref" bs=1M count=$n status=none || fail "make bg.ref"
within 120 dd if="$T/bg.ref" of="$MNT/bg" bs=1M oflag=direct conv=notrunc status=none ||
	{ tfs_stacks; fail "overwrite bg (124: not done in 120 s)"; }
ok=0
for i in $(seq 1 300); do
	if [ "$(tfs_stat_json cache dirty_bytes)" -eq "$bg" ] &&
		[ "$(dev_bytes write_bytes)" -ge $((w0 + 16 * MiB)) ]; then
		ok=1
		break
	fi
	sleep 0.05
done
d=$(tfs_stat_json cache dirty_bytes)
w=$(($(dev_bytes write_bytes) - w0))
[ $ok -eq 1 ] || fail "after a blind overwrite of $n MiB: dirty_bytes $d and $w bytes written back; want $bg dirty, 16 MiB written back"
[ "$w" -eq $((16 * MiB)) ] || fail "write-back went past the background mark: $w bytes"
within 120 cmp "$MNT/bg" "$T/bg.ref" || { tfs_stacks; fail "bg differs (124: cmp not done in 120 s)"; }
tfs_umount || fail "unmount"
TFS_DRAM=256M TFS_THREADS=4 tfs_mount
cmp "$MNT/bg" "$T/bg.ref" || fail "bg differs after remount"
tfs_umount || fail "unmount"
echo "   $n MiB overwritten blind: 16 MiB written back, $((bg / MiB)) MiB kept dirty in DRAM"
# A dirty mark smaller than the clean reserve: the background mark is at
# most the limit and not below 0 (it read -1 MiB with dirty=1M once).
TFS_DRAM=128M TFS_THREADS=4 tfs_mount "dirty=1M"
lim=$(tfs_stat_json cache dirty_limit_bytes) || fail "stats"
bg=$(tfs_stat_json cache dirty_background_bytes) || fail "stats"
tfs_umount || fail "unmount"
[ "$lim" -eq $((1 * MiB)) ] || fail "dirty=1M: dirty_limit_bytes $lim"
[ "$bg" -ge 0 ] && [ "$bg" -le "$lim" ] || fail "dirty=1M: dirty_background_bytes $bg, limit $lim"
echo "   dirty=1M: limit $lim, background mark $bg"
echo "7. the cycle with two and eight ranks, and with the parameters swapped"
# Measured with the cycle: 0.48 (two ranks) and 0.54 (parameters too).
# Without it (cache_policy=2q on the same runs): 0.77 and 0.66; lru: 0.81.
# Since the prefetch window covers the readers' aio queues (16 of the 256
# slots the cycle no longer keeps): 0.54-0.55 and 0.61-0.62 (0.50 and
# 0.55 before, in the same session), so the parameters' bound is 0.64,
# still under 2q's.
# Eight ranks, 18 subgroups each, the state 2.3 times the DRAM tier: each
# rank's folder is a stream of the learner's, with a cycle of its own
# (0.64-0.65 moved; the optimum is about 0.57). In one sequence of them all,
# the ranks' records drifted apart and no cycle held: 0.98 moved.
for case in "--ranks 2:0.6" "--offload-params:0.64" \
	"--ranks 8 --params 4.3e7 --sub-group-size 3e5:0.75"; do
	args=${case%:*} bound=${case##*:}
	# shellcheck disable=SC2086 # several words for swapbench
	out=$(swapbench_volume partitioned $args) || fail "swapbench $args"
	v=${out%% *}
	# The learner's cycle after each iteration. Ranks interleave
	# differently each time, and the learner may drop the period after the
	# last one (seen once under double load, with 0.43 moved: the cycle
	# held through the run), so the steady iterations count, not the end.
	cycles=$(paste -sd ' ' "$T/cycles")
	# shellcheck disable=SC2086 # one argument per iteration
	cycle=$(python3 -c "import sys; c = [int(x) for x in sys.argv[1:]]; print(max(c[1:5]) if len(c) >= 5 else 0)" $cycles)
	echo "   $args: cycle $((cycle / MiB)) MiB (bytes after each iteration: $cycles); device bytes per steady iteration / raw folder's: $v (iterations 2 on: ${out#* })"
	[ "$cycle" -gt 0 ] || fail "$args: the learner held no cycle after iterations 2 to 5"
	python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$v" "$bound" ||
		fail "$args: the devices moved $v of the raw folder's volume, more than $bound"
done
echo "8. the prefetch window with compute between the reads"
# 300 ms of simulated Adam per subgroup: a pass of the cycle is mostly
# compute, the device idles, and a window of a few blocks is late for many
# of its prefetches. The check is the rule, in counts: the first pass
# that wants a larger window gets one. How late the prefetches end up is
# the machine's speed, and a figure for the benchmarks, not a pass/fail
# here (under ASan on a loaded 2-core machine, 53 of 499 were late at the
# end, and none on a quiet one).
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
log_from=$(($(wc -l <"$LOG") + 1))
TFS_DRAM=256M TFS_THREADS=8 tfs_mount log_level=debug
d0=$(tfs_stat_json prefetch depth_blocks) || fail "stats: no prefetch depth_blocks"
cat >"$T/pf.sh" <<EOF
python3 -c 'import json, time; s=json.load(open("$MNT/.tensorfs/stats")); p=s["prefetch"]; print(p["depth_blocks"], p["issued"], p["late"], max(t.get("active_ms", 0) for t in s["tiers"].values()), int(time.time() * 1000))' >>"$T/pf"
EOF
: >"$T/pf"
"$SWAPBENCH" -d "$MNT" --params 3.2e7 --sub-group-size 8e6 --iters 9 --compute-ms 300 \
	--between "sh $T/pf.sh" >"$T/sb.out" 2>&1 || { cat "$T/sb.out"; fail "swapbench with compute"; }
tfs_umount || fail "unmount"
out=$(python3 - "$T/pf" "$d0" <<'PY'
import sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1])]
d0 = int(sys.argv[2])
issued = rows[-1][1] - rows[-3][1]
late = rows[-1][2] - rows[-3][2]
# the device's busy share of each iteration: the window grows only below half
busy = ",".join("%d%%" % (100 * (b[3] - a[3]) // max(1, b[4] - a[4])) for a, b in zip(rows, rows[1:]))
print("%s %d/%d, device busy %s" % (",".join(str(r[0]) for r in rows), late, issued, busy))
sys.exit(0 if rows[-1][1] > 0 else 1)
PY
) || fail "compute between reads: no prefetch issued (window ${out%% *} blocks after each iteration, from $d0)"
echo "   window after each iteration: ${out%% *} blocks (from $d0); late over the last two: ${out#* }"
tail -n +"$log_from" "$LOG" | grep 'prefetch pass: \|prefetch window ' >"$T/passes" ||
	fail "log_level=debug: no line per pass"
passes=$(python3 - "$T/passes" "$d0" "${out%% *}" <<'PY'
import re, sys
pat = re.compile(r"prefetch pass: [0-9.]+ s, (\d+) issued, (\d+) late, busiest device (\d+)%, "
                 r"window (\d+) -> (\d+) blocks$")
# The window also rises to cover the readers' queue between passes (tb_pf_readers).
rise = re.compile(r"prefetch window (\d+) -> (\d+) blocks: readers keep (\d+) blocks in flight$")
moves, rows = [], []
for l in open(sys.argv[1]):
    m = pat.search(l)
    if m:
        rows.append(tuple(map(int, m.groups())))
        moves.append(rows[-1][3:])
        continue
    m = rise.search(l)
    if not m:
        sys.exit("a window line not as documented: %s" % l.strip())
    a, b, q = map(int, m.groups())
    if b <= a or b > 4 * q:
        sys.exit("a rise for the readers' queue not as the rule says: %s" % l.strip())
    moves.append((a, b))
if not rows:
    sys.exit("no line per pass")
seen = {int(x) for x in sys.argv[3].split(",")}
chain = [moves[0][0]] + [m[1] for m in moves]
if moves[0][0] != int(sys.argv[2]):
    sys.exit("the first move started from %d, not the mount's %s" % (moves[0][0], sys.argv[2]))
if any(a[1] != b[0] for a, b in zip(moves, moves[1:])):
    sys.exit("the window jumped between the logged moves: %s" % chain)
if any(late > issued for issued, late, _, _, _ in rows):
    sys.exit("more late than issued in a pass")
if not seen <= set(chain):
    sys.exit("the stats showed windows %s that no pass set: %s" % (sorted(seen - set(chain)), chain))
# The rule, in counts (tb_pf_depth_next): a pass of 16 prefetches or more,
# a tenth of them late or more, with the busiest device in flight under
# half of it, wants a larger window. The first such pass finds no growth
# under judgment, so the window must have grown by the end of that pass;
# whether such a pass happens at all is the machine's speed, not the rule.
want = [i for i, (issued, late, pct, _, _) in enumerate(rows)
        if issued >= 16 and late * 10 >= issued and pct < 50]
if want and rows[want[0]][4] <= rows[want[0]][3]:
    sys.exit("pass %d wanted a larger window (%s) and the window stayed %d: %s"
             % (want[0], rows[want[0]], rows[want[0]][3], chain))
print("%d passes, %d wanting a larger window, window %s" % (len(rows), len(want), " ".join(map(str, chain))))
PY
) || fail "the debug log's passes: $passes"
echo "   the debug log: $passes"
echo "9. an fsync behind more dirty blocks than the flusher scans"
# 4 KiB blocks: 40 MiB of a are 10240 dirty blocks, kept in DRAM (no age
# limit), written before b's 16. The flusher walks at most 4096 dirty
# blocks from the oldest; b's fsync must still write b, and only b. (It
# waited for ever: b's blocks were past the walk, and nothing aged.)
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
TFS_DRAM=64M tfs_mount "block=4K,dirty_expire_ms=0"
dd if=/dev/urandom of="$MNT/a" bs=1M count=40 status=none || fail "write a"
dd if=/dev/urandom of="$MNT/b" bs=64K count=1 status=none || fail "write b"
d0=$(tfs_stat_json cache dirty_bytes)
within 60 python3 -c "import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDWR))" "$MNT/b" ||
	{ rc=$?; tfs_stacks; fail "fsync of b behind 10240 dirty blocks: status $rc (124: not done in 60 s)"; }
d1=$(tfs_stat_json cache dirty_bytes)
[ "$d0" -eq $((40 * MiB + 64 * 1024)) ] || fail "dirty before the fsync: $d0"
[ "$((d0 - d1))" -eq $((64 * 1024)) ] || fail "the fsync of b cleaned $((d0 - d1)) bytes, want 65536"
tfs_umount || fail "unmount"
echo "   fsync of 16 blocks behind 10240 dirty: wrote those 16"

echo "10. a cycle of 6000 files"
# 64 KiB files and blocks, 375 MiB against 128 MiB of DRAM (2048 slots):
# a period of 6000 uses, past the 4096 that the learner's first ring
# holds, and more objects resident than the cache once ranked (it held no
# cycle: every pass read all of it). Each file is read with O_DIRECT and
# its bytes checked, in every pass and after a remount.
MANY=6000
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
TFS_DRAM=128M tfs_mount "block=64K"
many() {
	python3 - "$MNT/many" "$MANY" "$1" <<'PY' || fail "$1 of the $MANY files"
import mmap, os, sys
d, n, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(d, exist_ok=True)
buf = mmap.mmap(-1, 65536)
for i in range(n):
    p = os.path.join(d, "f%05d" % i)
    if what == "write":
        buf[:] = i.to_bytes(8, "little") * 8192
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
        got = os.writev(fd, [buf])
    else:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
        got = os.readv(fd, [buf])
        if buf[:8] != i.to_bytes(8, "little") or buf[-8:] != buf[:8]:
            sys.exit("%s: wrong bytes" % p)
    os.close(fd)
    if got != 65536:
        sys.exit("%s: %d bytes" % (p, got))
PY
}
many write
for p in 1 2 3; do many read; done # the learner's passes
files=$(tfs_stat_json learner cycle_files)
[ "$files" -eq $MANY ] || fail "the learner holds a cycle of $files files, want $MANY"
r0=$(dev_bytes read_bytes)
many read
many read
r1=$(dev_bytes read_bytes)
ratio=$(python3 -c "import sys; print('%.3f' % ((int(sys.argv[2]) - int(sys.argv[1])) / (2 * $MANY * 65536)))" "$r0" "$r1")
tfs_umount || fail "unmount"
TFS_DRAM=128M tfs_mount "block=64K"
many read # every file's bytes again, from the devices
tfs_umount || fail "unmount"
echo "   device bytes read per pass / data: $ratio (2Q 1.0); every file whole after a remount"
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 0.8 else 1)" "$ratio" ||
	fail "a cycle of $MANY files read $ratio of the data per pass, more than 0.8"
echo "PASS: device volume"
