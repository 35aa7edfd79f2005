#!/bin/bash
# A prefetch turn against a truncate of its file. The prefetch thread
# issues a turn of up to 32 blocks under one plug: its loads reach the
# devices together, when the turn ends. A truncate (setattr, O_TRUNC) takes
# the file's I/O lock exclusive, then waits in tb_drop for the file's loads
# in flight. When the turn took that lock per block, a truncate could take
# it between two blocks and wait for a load still held in the plug, while
# the prefetch thread waited for the lock: neither went on. A delay in each
# block the owner asks for (op=prefetch) stretches a turn to seconds, so
# the truncate comes in the middle of it:
#
#   1. truncate(2) to 0 in the middle of a hinted turn (tfsctl prefetch)
#      returns, once the turn has ended; the file is empty, the daemon
#      answers, the other file is whole.
#   2. The same with open(O_TRUNC), and the file written again after it.
#
# Each step is bounded; a hang fails with the daemon's threads.

. "$(dirname "$0")/lib_fault.sh"

MiB=$((1024 * 1024))
TFS_UMOUNT_S=60
DELAY_MS=100

# injected_prefetches: blocks of prefetch turns delayed so far.
injected_prefetches() {
	grep -c "fault injected: prefetch block" "$LOG" || true
}

# dram_bytes FILE: its bytes in the DRAM tier.
dram_bytes() {
	python3 -c 'import json, os, sys; print(json.loads(os.getxattr(sys.argv[1], "user.tensorfs.tiers")).get("dram", 0))' "$1"
}

# turn_then FILE CMD...: evict FILE, hint it, wait until its turn holds a
# block in its plug (the second block delayed), then run CMD, bounded.
turn_then() {
	local f=$1 n0 i
	shift
	within 60 "$TFSCTL" -m "$MNT" evict "$f" >/dev/null || fail "tfsctl evict $f"
	[ "$(dram_bytes "$f")" -eq 0 ] || fail "$f still in DRAM after evict"
	n0=$(injected_prefetches)
	fault_set "dev=prefetch,op=prefetch,err=delay,ms=$DELAY_MS"
	within 30 "$TFSCTL" -m "$MNT" prefetch "$f" >/dev/null || fail "tfsctl prefetch $f"
	for i in $(seq 1 200); do
		[ "$(injected_prefetches)" -ge $((n0 + 2)) ] && break
		sleep 0.05
	done
	[ "$(injected_prefetches)" -ge $((n0 + 2)) ] || fail "no prefetch turn began on $f"
	within 60 "$@" || { rc=$?; tfs_stacks; fail "$* in a prefetch turn: status $rc (124: not done in 60 s)"; }
	fault_off
}

TFS_DRAM=256M TFS_THREADS=4 tfs_mount
fault_check_build
dd if=/dev/urandom of="$T/ref" bs=1M count=64 status=none || fail "make ref"
for f in a b; do
	cp "$T/ref" "$MNT/$f" || fail "write $f"
done
echo "1. truncate in the middle of a prefetch turn"
turn_then "$MNT/a" truncate -s 0 "$MNT/a"
[ "$(stat -c %s "$MNT/a")" -eq 0 ] || fail "a not truncated"
fault_alive "after the truncate"
within 60 cmp "$MNT/b" "$T/ref" || fail "b differs"
issued=$(tfs_stat_json prefetch issued)
[ "$issued" -gt 0 ] || fail "no prefetch was issued"
echo "   truncated during a turn of $DELAY_MS ms a block; $issued prefetches issued"

echo "2. open(O_TRUNC) in the middle of a prefetch turn, then the file again"
turn_then "$MNT/b" python3 -c "import os, sys; os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC))" "$MNT/b"
[ "$(stat -c %s "$MNT/b")" -eq 0 ] || fail "b not truncated"
within 60 cp "$T/ref" "$MNT/b" || fail "write b again"
tfs_umount || fail "unmount"
TFS_DRAM=256M TFS_THREADS=4 tfs_mount
cmp "$MNT/b" "$T/ref" || fail "b differs after remount"
[ "$(stat -c %s "$MNT/a")" -eq 0 ] || fail "a not empty after remount"
tfs_umount || fail "unmount"
echo "   O_TRUNC during a turn returned; b written again and whole after remount"
