#!/bin/bash
# Mount test: a limit on tasks that leaves the daemon fewer threads than it
# starts, as a container's or a service's does (a cgroup's pids.max;
# systemd's TasksMax is one). The daemon is started as a service starts it,
# in the background (no -f), where the parent's exit status is its word on
# the mount, in a pids cgroup of its own; the limit is swept from 2 tasks
# upward until the daemon mounts. The store already holds a file.
#   - Under that limit: the status is non-zero, stderr says why (EAGAIN's
#     "Resource temporarily unavailable"), no mount is left and the cgroup
#     is empty within 30 s.
#   - At it, status 0: the mount serves. It is still there 1 s later, and a
#     file 2.5x the DRAM tier written with fsync reads back the same, so
#     that writes waited for room with the few threads there were. The
#     unmount ends the daemon with everything written back (its log).
#   - Without the limit, a remount reads both files as they were written:
#     the failed starts lost nothing.
# A daemon that starts its serving threads only after mounting fails here:
# it said it mounted (status 0) where it then found no thread to serve
# /dev/fuse and went away, leaving a mount that lasted a moment.
# Bound on a hang: each start, I/O and unmount is under timeout.

. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib_cgroup.sh"

cg_make pids pids.max pids.max
cg_tasks() { cat "$CG/pids.current" 2>/dev/null || echo 0; }

OPTS="nvme=$NVME,meta=$META,dram=128M,threads=16"
DLOG="$T/daemon-bg.log"

# A file in the store before the sweep.
TFS_DRAM=128M tfs_mount
head -c $((64 << 20)) /dev/urandom >"$T/before"
head -c $((320 << 20)) /dev/urandom >"$T/big"
cp "$T/before" "$MNT/before" && sync "$MNT/before" || fail "cannot write the first file"
tfs_umount || fail "the first unmount exited $?"

# start_limited K: the daemon in the background in the cgroup, limited to K tasks; its status in RC
start_limited() {
	echo "$1" >"$CG/pids.max" || fail "cannot set pids.max to $1"
	cg_start "$OPTS,logfile=$DLOG"
}

k=2
refused=0
while :; do
	[ $k -le 200 ] || fail "the daemon did not mount with 200 tasks"
	start_limited $k
	[ $RC -eq 0 ] && break
	grep -q "Resource temporarily unavailable" "$T/stderr" ||
		fail "limit $k: status $RC, and stderr does not say why: $(cat "$T/stderr")"
	is_mounted "$MNT" && fail "limit $k: status $RC, but $MNT is mounted"
	cg_empty 30 || fail "limit $k: status $RC, and $(cg_tasks) tasks are left: $(cg_procs)"
	LAST=$(tail -n 1 "$T/stderr")
	[ -z "${TFS_VERBOSE:-}" ] || echo "   limit $k: $LAST"
	refused=$((refused + 1))
	k=$((k + 1))
done
echo "   refused under $k tasks ($refused starts), the last with: $LAST"
[ $refused -gt 0 ] || fail "mounted with 2 tasks: the limit did not bite"

sleep 1
is_mounted "$MNT" || fail "limit $k: status 0, but the mount was gone 1 s later ($(tail -n 3 "$DLOG"))"
timeout 120 dd if="$T/big" of="$MNT/big" bs=1M conv=fsync status=none ||
	fail "limit $k: writing 320 MiB through the mount failed or hung"
timeout 120 cmp -s "$T/big" "$MNT/big" || fail "limit $k: the 320 MiB file reads back different"
timeout 120 cmp -s "$T/before" "$MNT/before" || fail "limit $k: the first file reads back different"
echo "   mounted with $k tasks: $(grep -c "warning: started" "$T/stderr") pools started short; 320 MiB written and read back"
timeout 60 fusermount3 -u "$MNT" || fail "cannot unmount"
cg_empty 60 || fail "the daemon did not end within 60 s of its unmount"
grep -q "stopped: all written back" "$DLOG" || fail "the daemon did not stop clean: $(tail -n 3 "$DLOG")"

echo max >"$CG/pids.max"
TFS_DRAM=128M tfs_mount
cmp -s "$T/before" "$MNT/before" || fail "after the sweep, the first file differs"
cmp -s "$T/big" "$MNT/big" || fail "after a remount, the file written under the limit differs"
tfs_umount || fail "the last unmount exited $?"
echo "PASS: refused with a clear error under $k tasks, served at $k, nothing lost"
exit 0
