#!/bin/bash
# Mount test: faults of the filesystems under the tiers other than an
# nvme folder's, each on a filesystem of its own (ext4 in a loop image,
# else a tmpfs), with an nvme folder on the test's disk beside it.
#   1. A pfs folder (remote=) on a small filesystem that another process
#      fills, the nvme folder with room: within 10 s pfs's avail says its
#      filesystem is full (its room is followed); new files written with
#      fsync, and the older ones removed, for 8 s (past a full device's
#      5 s pause): every fsync succeeds, as the blocks go to nvme0; the
#      files read back after a remount; fsck is clean. (Regressions: pfs's
#      room was not followed, and the slot of a write that said ENOSPC,
#      taken back, and any slot freed on pfs, counted as room: the next
#      blocks went there and failed again, until dd's fsync said ENOSPC
#      with nvme0 nearly empty.)
#   2. meta= on a filesystem that turns read-only (ext4 errors=remount-ro,
#      an error raised through sysfs, as a failing disk would): a create
#      fails with EROFS within BOUND s, what was written reads back,
#      health names the metadata's failing commits, and a new mount is
#      refused with the reason. Skipped without ext4 on a loop device.
#   3. A pfs folder whose filesystem stops answering (a parallel
#      filesystem's servers stall; fsfreeze of its ext4), then answers
#      again: blocks go to pfs (it takes some of a 64 MiB write with
#      fsync); frozen under a 96 MiB write with fsync, within 20 s health
#      names pfs ("no request finished for N s") and its stats give
#      unanswered_ms, while the write waits (the blocks already on their
#      way to pfs wait for it: a request sent to a filesystem cannot be
#      taken back); thawed, the write ends within BOUND s, successfully,
#      health drops the line, both files read back after a remount, and
#      fsck is clean. (Regression: while a stalled pfs held the fsync,
#      health said "ok" and pfs "up".) Skipped without fsfreeze or ext4.

. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib_fullfs.sh"

: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

BOUND=30 # seconds a writer may take to end
MiB=$((1 << 20))
export TFS_DRAM=128M

SRC="$T/src"
head -c $((300 * MiB)) /dev/urandom >"$SRC" || fail "cannot make the source bytes"

echo "1. a pfs folder on a small filesystem that another process fills, nvme with room"
# pfs_at P F: where in $SRC file F of pass P starts: no two files' blocks
# alike (each offset apart in its KiB), or dedup would store them once.
pfs_at() {
	echo $(($2 * 48 * MiB + ($1 * 4 + $2) * 4096))
}
# pfs_pass P: write q$P-1 to q$P-4, 64 MiB each, each with an fsync that
# must succeed within BOUND s; then remove the files of pass P-2. New
# files take new space; the removals free slots on both devices.
pfs_pass() {
	local f
	for f in 1 2 3 4; do
		within "$BOUND" dd if="$SRC" of="$MNT/q$1-$f" bs=1M skip="$(pfs_at "$1" $f)" \
			iflag=skip_bytes count=64 conv=fsync status=none 2>"$T/dd.err" ||
			fail "pass $1: dd of q$1-$f with pfs full and nvme0 with room: $(cat "$T/dd.err")"
	done
	rm -f "$MNT/q$(($1 - 2))-"*
}
# pfs_check P: the files of pass P read back.
pfs_check() {
	local f
	for f in 1 2 3 4; do
		cmp -n $((64 * MiB)) "$MNT/q$1-$f" <(tail -c +$(($(pfs_at "$1" $f) + 1)) "$SRC") ||
			fail "q$1-$f does not read back what pass $1 wrote"
	done
}
small_fs "$T/pfsfs" 200
NVME="$T/nvme1"
META="$T/meta1"
mkdir -m 700 "$NVME" "$T/pfsfs/pfs"
tfs_mount "remote=$T/pfsfs/pfs"
pfs_pass 0
[ "$(tfs_stat_json tiers pfs used)" -gt 0 ] || fail "pfs took no block before the fill"
fill "$T/pfsfs" filler
# Its room is followed, off the placement path (a pool thread's statfs,
# once a second): the stats say it can take next to nothing within 10 s.
for i in $(seq 1 100); do
	pfs_avail=$(tfs_stat_json tiers pfs avail) || fail "stats unreadable"
	[ "$pfs_avail" -le $((8 * MiB)) ] && break
	sleep 0.1
done
[ "$pfs_avail" -le $((8 * MiB)) ] || fail "pfs's filesystem is full, and pfs says it can take $pfs_avail bytes"
# Longer than a full device's 5 s pause, so that it is tried again.
pass=1
end=$((SECONDS + 8))
while [ $SECONDS -lt $end ]; do
	pfs_pass $pass
	pass=$((pass + 1))
done
last=$((pass - 1))
grep -q "pfs ($T/pfsfs/pfs): full" "$LOG" || fail "pfs never said it is full"
echo "   $pass passes of 4 new files with fsync, all succeeded; write-back errors: $(tfs_stat_json cache writeback_errors)"
tfs_umount || fail "tensorfs exited with an error at unmount"
"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
tail -n 1 "$T/fsck.out" | grep -qx 'fsck: clean' || fail "fsck: $(cat "$T/fsck.out")"
rm -f "$T/pfsfs/filler"
tfs_mount "remote=$T/pfsfs/pfs"
pfs_check $((last - 1))
pfs_check $last
tfs_umount || fail "tensorfs exited with an error at unmount"

echo "2. the metadata's filesystem turns read-only (ext4 errors=remount-ro)"
small_fs "$T/rofs" 64
knob=/sys/fs/ext4/$(basename "${SMALL_LOOPS[${#SMALL_LOOPS[@]} - 1]:-none}")/trigger_fs_error
if [ "$SMALL_KIND" != ext4 ] || [ ! -w "$knob" ]; then
	echo "   skipped: needs ext4 on a loop device and $knob"
else
	mount -o remount,errors=remount-ro "$T/rofs" || fail "cannot set errors=remount-ro"
	NVME="$T/nvme2"
	META="$T/rofs/meta"
	mkdir -m 700 "$NVME"
	tfs_mount
	dd if="$SRC" of="$MNT/r" bs=1M count=32 conv=fsync status=none || fail "dd before the error"
	echo "a test's error" >"$knob"
	for i in $(seq 1 50); do
		awk -v d="$T/rofs" '$2 == d { split($4, o, ","); exit o[1] == "ro" ? 0 : 1 }' /proc/mounts && break
		sleep 0.1
	done
	within "$BOUND" touch "$MNT/new" 2>"$T/touch.err" && fail "a create succeeded with the metadata read-only"
	grep -q "Read-only file system" "$T/touch.err" || fail "a create said: $(cat "$T/touch.err")"
	cmp -n $((32 * MiB)) "$SRC" "$MNT/r" || fail "r does not read back with the metadata read-only"
	health=$(tfs_stat_json health) || fail "stats unreadable"
	case "$health" in
	"metadata commits failing for "*"(Read-only file system)"*) ;;
	*) fail "health with the metadata read-only: $health" ;;
	esac
	echo "   health: $health"
	tfs_umount || echo "   the daemon's exit status: $?"
	rc=0
	tfs_start "nvme=$NVME,meta=$META,dram=$TFS_DRAM" || rc=$?
	[ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "a mount on the read-only metadata: status $rc"
	tail -n 1 "$LOG" | grep -q "Read-only file system" || fail "the refused mount says: $(tail -n 1 "$LOG")"
fi

echo "3. a pfs folder whose filesystem stops answering"
small_fs "$T/frzfs" 400
if [ "$SMALL_KIND" != ext4 ] || ! command -v fsfreeze >/dev/null 2>&1; then
	echo "   skipped: needs fsfreeze and ext4 on a loop device"
else
	export TFS_DRAM=256M
	NVME="$T/nvme3"
	META="$T/meta3"
	mkdir -m 700 "$NVME" "$T/frzfs/pfs"
	tfs_mount "remote=$T/frzfs/pfs"

	dd if="$SRC" of="$MNT/a" bs=1M count=64 conv=fsync status=none || fail "dd of a"
	[ "$(tfs_stat_json tiers pfs used)" -gt 0 ] || fail "pfs took no block of a"

	fsfreeze -f "$T/frzfs" || fail "cannot freeze $T/frzfs"
	# Thawed in 60 s whatever happens, so that no cleanup waits on it for ever:
	# one process, which the cleanup's SIGKILL ends whole.
	run_bg python3 -c 'import subprocess, sys, time; time.sleep(60); subprocess.run(["fsfreeze", "-u", sys.argv[1]])' \
		"$T/frzfs" </dev/null >/dev/null 2>&1
	run_bg dd if="$SRC" of="$MNT/b" bs=1M skip=64 count=96 conv=fsync status=none
	writer=$BG
	health=""
	for i in $(seq 1 200); do
		health=$(tfs_stat_json health) || fail "stats unreadable"
		case "$health" in
		*"pfs: no request finished for "*" in flight)"*) break ;;
		esac
		sleep 0.1
	done
	case "$health" in
	*"pfs: no request finished for "*) ;;
	*) fail "20 s into pfs's freeze, health says: $health" ;;
	esac
	unanswered=$(tfs_stat_json tiers pfs unanswered_ms) || fail "stats: no unanswered_ms"
	[ "$unanswered" -ge 10000 ] || fail "health names pfs, but its unanswered_ms is $unanswered"
	[ "$(tfs_stat_json tiers nvme0 unanswered_ms)" -lt 10000 ] || fail "nvme0 has requests unanswered too"
	alive "$writer" || fail "the write ended while pfs was frozen: it should wait for it"
	echo "   health: $health"

	fsfreeze -u "$T/frzfs" || fail "cannot thaw $T/frzfs"
	rc=0
	waitfor "$writer" "$BOUND" || rc=$?
	[ $rc -eq 0 ] || fail "the write after the thaw: status $rc (124: still running after $BOUND s)"
	health=$(tfs_stat_json health) || fail "stats unreadable"
	case "$health" in
	*"no request finished"*) fail "after the thaw, health still says: $health" ;;
	esac
	tfs_umount || fail "tensorfs exited with an error at unmount"
	"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
	tail -n 1 "$T/fsck.out" | grep -qx 'fsck: clean' || fail "fsck: $(cat "$T/fsck.out")"
	tfs_mount "remote=$T/frzfs/pfs"
	cmp -n $((64 * MiB)) "$SRC" "$MNT/a" || fail "a does not read back"
	cmp -n $((96 * MiB)) "$MNT/b" <(tail -c +$((64 * MiB + 1)) "$SRC") || fail "b does not read back"
	tfs_umount || fail "tensorfs exited with an error at unmount"
fi

echo "PASS: a full or stalled pfs folder, and a read-only metadata filesystem, end in the right data or a clear error ($SMALL_KIND)"
exit 0
