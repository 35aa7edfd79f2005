#!/bin/bash
# tfsctl unmount of a daemon whose write-back fails: it must not say that
# all went well.
#
# 32 MiB dirty in DRAM (dirty_expire_ms=0, dedup=off), then every write of
# nvme0 fails with EIO, and tfsctl unmount: the daemon retries its
# write-back for 20 s after the unmount, gives up and exits 1. tfsctl
# unmount must return after that (within 120 s), with exit status 1 and a
# message that says the write-back failed; the store's lock file says
# "failed" for the daemon's pid. Then, with the faults off, the store
# mounts again (the failed stop's lock file is taken over) and fsck finds
# it clean.

. "$(dirname "$0")/lib_fault.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

echo "1. tfsctl unmount while every write of nvme0 fails"
fault_off
tfs_mount "dedup=off,dirty_expire_ms=0"
fault_check_build
head -c 32M /dev/urandom >"$MNT/f" || fail "writing f"
P=$TFS_PID
fault_set "dev=nvme0,op=write,err=EIO"
within 120 "$TFSCTL" unmount "$MNT" >"$T/unmount.out" 2>&1
rc=$?
[ $rc -eq 124 ] && fail "tfsctl unmount did not return within 120 s"
[ $rc -eq 1 ] || fail "tfsctl unmount exited $rc although the write-back failed: $(cat "$T/unmount.out")"
grep -q "could not write back everything" "$T/unmount.out" ||
	fail "tfsctl unmount did not say that the write-back failed: $(cat "$T/unmount.out")"
echo "   $(tail -n 1 "$T/unmount.out")"
alive "$P" && fail "tfsctl unmount returned while the daemon runs"
wait "$P"
drc=$?
TFS_PID=""
[ $drc -eq 1 ] || fail "the daemon exited $drc after a failed write-back, not 1"
{ [ "$(head -n 1 "$META/lock")" = "$P" ] && grep -q "^failed " "$META/lock"; } ||
	fail "the lock file does not say that pid $P failed: $(cat "$META/lock")"
[ "$(fault_count)" -gt 0 ] || fail "no fault was injected"

echo "2. the store mounts again, and is clean"
fault_off
tfs_fsck
tfs_mount
tfs_umount || fail "the daemon exited $? at unmount"
[ -s "$META/lock" ] && fail "a clean stop left the lock file: $(cat "$META/lock")"
echo "PASS"
