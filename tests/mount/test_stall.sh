#!/bin/bash
# Mount test: a pfs folder whose filesystem stops answering (a parallel
# filesystem's servers stall; here fsfreeze on a loop ext4), then answers
# again.
#   1. Blocks go to pfs (it takes some of a 64 MiB write with fsync).
#   2. Its filesystem is frozen while a 96 MiB write with fsync goes on:
#      within 20 s, health names pfs ("no request finished for N s") and
#      its stats give unanswered_ms; the write is still waiting (the
#      blocks already on their way to pfs wait for it: a request sent to a
#      filesystem cannot be taken back).
#   3. Thawed: the write ends within BOUND s, successfully; health drops
#      the line; both files read back after a remount; fsck is clean.
# (Regression: while a stalled pfs held the fsync, health said "ok" and
# pfs "up", and nothing said why the writer waited.)
# Skipped where fsfreeze or a loop device cannot be had.

. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib_fullfs.sh"

: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
command -v fsfreeze >/dev/null 2>&1 || skip "fsfreeze not found (util-linux)"

BOUND=30
MiB=$((1 << 20))
export TFS_DRAM=256M

SRC="$T/src"
head -c $((160 * MiB)) /dev/urandom >"$SRC" || fail "cannot make the source bytes"
small_fs "$T/pfsfs" 400
[ "$SMALL_KIND" = ext4 ] || skip "no loop device for an ext4 to freeze"
mkdir -m 700 "$T/pfsfs/pfs"
tfs_mount "remote=$T/pfsfs/pfs"

echo "1. blocks go to pfs"
dd if="$SRC" of="$MNT/a" bs=1M count=64 conv=fsync status=none || fail "dd of a"
[ "$(tfs_stat_json tiers pfs used)" -gt 0 ] || fail "pfs took no block of a"

echo "2. pfs's filesystem frozen under a write with fsync"
fsfreeze -f "$T/pfsfs" || skip "cannot freeze $T/pfsfs"
# Thawed in 60 s whatever happens, so that no cleanup waits on it for ever:
# one process, which the cleanup's SIGKILL ends whole.
run_bg python3 -c 'import subprocess, sys, time; time.sleep(60); subprocess.run(["fsfreeze", "-u", sys.argv[1]])' \
	"$T/pfsfs" </dev/null >/dev/null 2>&1
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
[ "$(tfs_stat_json tiers nvme0 unanswered_ms)" = 0 ] || fail "nvme0 has requests unanswered too"
alive "$writer" || fail "the write ended while pfs was frozen: it should wait for it"
echo "   health: $health"

echo "3. thawed: the write ends, and everything reads back"
fsfreeze -u "$T/pfsfs" || fail "cannot thaw $T/pfsfs"
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
tfs_mount "remote=$T/pfsfs/pfs"
cmp -n $((64 * MiB)) "$SRC" "$MNT/a" || fail "a does not read back"
cmp -n $((96 * MiB)) "$MNT/b" <(tail -c +$((64 * MiB + 1)) "$SRC") || fail "b does not read back"
tfs_umount || fail "tensorfs exited with an error at unmount"
echo "PASS: a pfs folder that stops answering is named in health, and its writer ends once it answers"
exit 0
