#!/bin/bash
# Mount test, the fault matrix of a full disk: another process fills a
# filesystem the mount uses during a swapbench run, holds it full, then
# frees it. The cells, one filesystem filled each:
#   nvme+meta  the nvme folder's, with the metadata inside the folder;
#   nvme       the nvme folder's, with meta= on another filesystem;
#   meta       the metadata's (meta= on its own filesystem): commits fail
#              while the nvme folder has room, and writers wait at the
#              dirty mark.
# Checked in each:
#   - every request ends, the disk full or not: while it is full (HOLD
#     s), each call of the fsync writer ends within BOUND s; after the
#     space's return, swapbench and the fsync writer end within BOUND s,
#     and none is left in D state (regression: writers sat at the dirty
#     mark, unkillable, for as long as the disk stayed full);
#   - the writers saw ENOSPC or success: swapbench exits 0, or 2 with
#     only "No space left on device" (never a short transfer, another
#     error, or data that does not verify), and every failed call of the
#     fsync writer (1 MiB files, each written, fsynced, closed) says ENOSPC;
#   - no fsynced byte is lost: after unmount, fsck and remount, every file
#     whose fsync succeeded reads back byte for byte;
#   - fsck is clean;
#   - the run completes after space returns: a new swapbench run passes
#     its own verification, and a new file is fsynced.
# A filesystem filled is ext4 in a loop image (a tmpfs with size= where
# loop devices cannot be had), 768 MiB for the nvme folder, 32 MiB for
# the metadata alone; dram=128M, below the swap state. The cells run at
# once, each with its own filesystem, mount and daemon.

. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib_fullfs.sh"

command -v python3 >/dev/null 2>&1 || skip "python3 not found"
: "${SWAPBENCH:?SWAPBENCH must name the swapbench binary}"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

BOUND=30 # seconds a call may take, the disk full or not; and the run, once space is back
HOLD=32	 # seconds the disk stays full (more than BOUND)
SB_ARGS="--params 1e7 --sub-group-size 2.5e6 --json"
declare -A CELL_PID


cat >"$T/fsyncer.py" <<'PY'
import errno, json, os, random, sys, time

mode, d, log = sys.argv[1:4]
MiB = 1 << 20


def data(seed):
    return random.Random(seed).randbytes(MiB)


if mode == "write":
    # Until the stop file appears (one file at least): write a 1 MiB
    # file, fsync, close; log each outcome.
    stop = sys.argv[4]
    os.makedirs(d, exist_ok=True)
    k = 0
    with open(log, "a") as out:
        while k == 0 or not os.path.exists(stop):
            name, seed, err = f"f{k:05d}", k + 1, None
            k += 1
            try:
                fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as e:
                err, fd = e.errno, None
            if fd is not None:
                try:
                    if os.write(fd, data(seed)) != MiB:
                        err = "short"
                    else:
                        os.fsync(fd)
                except OSError as e:
                    err = e.errno
                finally:
                    try:
                        os.close(fd)
                    except OSError as e:
                        err = err or e.errno
            out.write(json.dumps({"name": name, "seed": seed, "t": time.time(),
                                  "err": errno.errorcode.get(err, err) if err else None}) + "\n")
            out.flush()
            time.sleep(0.05)
else:
    bad = []
    recs = [json.loads(l) for l in open(log)]
    ok = [r for r in recs if r["err"] is None]
    errs = sorted({r["err"] for r in recs if r["err"] is not None})
    for r in recs:
        if r["err"] not in (None, "ENOSPC"):
            bad.append(f"{r['name']}: {r['err']}, want ENOSPC or success")
    for r in ok:
        try:
            with open(os.path.join(d, r["name"]), "rb") as f:
                got = f.read()
        except OSError as e:
            bad.append(f"{r['name']} was fsynced and is gone: {e}")
            continue
        if got != data(r["seed"]):
            bad.append(f"{r['name']} was fsynced and reads back {len(got)} wrong bytes")
    print(f"{len(recs)} files, {len(ok)} fsynced, failures: {errs or 'none'}")
    for b in bad[:10]:
        print("  " + b, file=sys.stderr)
    sys.exit(1 if bad else 0)
PY

# sb_check NAME RC: swapbench's exit status and stderr ($T/NAME.err) say
# success, or ENOSPC and nothing else.
sb_check() {
	local other
	case $2 in
	0) return 0 ;;
	2) ;;
	*) fail "swapbench $1 exited $2: $(tail -n 5 "$T/$1.err")" ;;
	esac
	grep -q "No space left on device" "$T/$1.err" || fail "swapbench $1 failed without ENOSPC: $(tail -n 5 "$T/$1.err")"
	other=$(grep -v "No space left on device" "$T/$1.err" | grep -v "rank [0-9]* failed (exit status 2)" | grep .)
	[ -z "$other" ] || fail "swapbench $1 saw more than ENOSPC: $other"
}

# cell NAME FULL: one cell, $NVME and $META set, FULL the folder to fill.
cell() {
	local c=$1 full=$2 rc p last out
	echo "$c: filling $full during swapbench ($SMALL_KIND)"
	TFS_DRAM=128M TFS_THREADS=16 tfs_mount
	mkdir -p "$MNT/sb" || fail "$c: mkdir on the mount"
	run_bg "$SWAPBENCH" $SB_ARGS --iters 60 "$MNT/sb" >"$T/a.json" 2>"$T/a.err"
	SB_A=$BG
	rm -f "$T/stop" "$T/fsync.log" "$T/fsync2.log"
	run_bg python3 "$T/fsyncer.py" write "$MNT/fs" "$T/fsync.log" "$T/stop"
	FSYNCER=$BG
	sleep 3
	alive "$SB_A" || echo "   note: swapbench ended before the disk filled"
	fill "$full" filler
	sleep "$HOLD"
	# While it is full, the fsync writer's calls end (its log moves on).
	last=$(tail -n 1 "$T/fsync.log" | python3 -c 'import json, sys, time; print(int(time.time() - json.loads(sys.stdin.read())["t"]))')
	if [ "$last" -ge "$BOUND" ]; then
		tfs_stacks
		fail "$c: the fsync writer's last call ended $last s ago, the disk full (state $(pstate "$FSYNCER"), wchan $(cat /proc/"$FSYNCER"/wchan 2>/dev/null))"
	fi
	echo "   on the full disk: health: $(tfs_stat_json health)"
	rm -f "$full/filler"

	# Space is back: swapbench ends, with success or ENOSPC.
	rc=0
	waitfor "$SB_A" "$BOUND" || rc=$?
	if [ $rc -eq 124 ]; then
		tfs_stacks
		fail "$c: swapbench still runs $BOUND s after space came back (state $(pstate "$SB_A"), wchan $(cat /proc/"$SB_A"/wchan 2>/dev/null))"
	fi
	sb_check a $rc
	echo "   swapbench through the fault: exit $rc"
	touch "$T/stop"
	rc=0
	waitfor "$FSYNCER" "$BOUND" || rc=$?
	[ $rc -ne 124 ] || fail "$c: the fsync writer still runs $BOUND s after space came back (state $(pstate "$FSYNCER"))"
	[ $rc -eq 0 ] || fail "$c: the fsync writer failed ($rc)"
	for p in "${BG_PIDS[@]}"; do
		[ "$(pstate "$p")" != D ] || fail "$c: process $p is in D state"
	done

	# What was fsynced is there after a clean unmount, fsck and a remount.
	tfs_umount || fail "$c: tensorfs exited with an error at unmount"
	"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "$c: fsck: $(cat "$T/fsck.out")"
	tail -n 1 "$T/fsck.out" | grep -qx 'fsck: clean' || fail "$c: fsck: $(cat "$T/fsck.out")"
	TFS_DRAM=128M TFS_THREADS=16 tfs_mount
	out=$(python3 "$T/fsyncer.py" check "$MNT/fs" "$T/fsync.log" 2>&1) || fail "$c: fsync writer: $out"
	echo "   fsync writer: $out"

	# The run completes now: a new swapbench run, and a new fsynced file.
	rm -rf "$MNT/sb" "$MNT/fs" || fail "$c: cannot remove the first run's files"
	mkdir -p "$MNT/sb2"
	rc=0
	within "$BOUND" "$SWAPBENCH" $SB_ARGS --iters 3 "$MNT/sb2" >"$T/b.json" 2>"$T/b.err" || rc=$?
	[ $rc -eq 0 ] || fail "$c: swapbench after space came back: exit $rc: $(tail -n 5 "$T/b.err")"
	python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); v = r["verify"]
sys.exit(0 if v["errors"] == 0 and v["checked_bytes"] > 0 else 1)' "$T/b.json" ||
		fail "$c: swapbench after space came back does not verify: $(cat "$T/b.json")"
	python3 "$T/fsyncer.py" write "$MNT/fs2" "$T/fsync2.log" "$T/stop" # one file: the stop is there
	grep -q '"err": null' "$T/fsync2.log" || fail "$c: an fsynced file after space came back: $(cat "$T/fsync2.log")"
	tfs_umount || fail "$c: tensorfs exited with an error at unmount"
	"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "$c: fsck: $(cat "$T/fsck.out")"
	tail -n 1 "$T/fsck.out" | grep -qx 'fsck: clean' || fail "$c: fsck: $(cat "$T/fsck.out")"
}

# The three cells run at once, each in a run of this script of its own
# (FM_CELL names its cell): its own work folder, filesystems, mount and
# cleanup. Each holds its disk full for HOLD s, so one after another
# they took over two minutes, the longest test of the suite.
case ${FM_CELL:-} in
nvme+meta)
	small_fs "$T/disk" 768
	NVME="$T/disk/nvme" META="$T/disk/nvme/meta"
	mkdir -m 700 "$NVME"
	cell nvme+meta "$T/disk"
	exit 0
	;;
nvme)
	small_fs "$T/disk" 768
	NVME="$T/disk/nvme" META="$T/meta2"
	mkdir -m 700 "$NVME"
	cell nvme "$T/disk"
	exit 0
	;;
meta)
	small_fs "$T/disk" 32
	NVME="$T/nvme3" META="$T/disk/meta"
	mkdir -m 700 "$NVME"
	cell meta "$T/disk"
	exit 0
	;;
"") ;;
*) fail "FM_CELL=$FM_CELL: no such cell" ;;
esac

CELLS="nvme+meta nvme meta"
for c in $CELLS; do
	FM_CELL=$c bash "$0" >"$T/cell-$c.log" 2>&1 &
	CELL_PID[$c]=$!
done
failed="" skipped=""
for c in $CELLS; do
	rc=0
	wait "${CELL_PID[$c]}" || rc=$?
	sed "s/^/[$c] /" "$T/cell-$c.log"
	case $rc in
	0) ;;
	77) skipped="$skipped $c" ;;
	*) failed="$failed $c (exit $rc)" ;;
	esac
done
[ -z "$failed" ] || fail "cells failed:$failed"
[ -z "$skipped" ] || skip "cells skipped:$skipped"
echo "PASS: a disk filled during a swapbench run: writers saw ENOSPC or success, nothing fsynced was lost"
exit 0
