#!/bin/bash
# Fault injection on the s3 tier (against s3rver): every block lives in the
# bucket (nvme=none), and the device fails or stalls requests.
#
#   1. Half the HTTP attempts are answered 503: the s3 engine retries them,
#      so every write, fsync and read succeeds with the right bytes.
#   2. 30% of GETs fail with EIO: every read (O_DIRECT, past the page
#      cache) is right or EIO, some are EIO;
#      with the faults off everything reads right.
#   3. 30% of PUTs fail with EIO: write-back retries; what fsync accepted,
#      and after the faults end everything written, reads back right.
#   4. Requests stall 100 ms: everything succeeds.
# After the parts: a clean unmount, fsck, and a strict read-back.

FAULT_S3=1
. "$(dirname "$0")/lib_fault.sh"

SEED=${FAULT_SEED:-$((RANDOM << 15 | RANDOM))}
echo "fault s3 test, seed $SEED"
s3_start
NVME=none
mkdir -p "$META"
OPTS="$(s3_mount_opts "fault$SEED"),remote_timeout=20"

strict_read() {
	local out
	out=$(python3 "$FAULTIO" read "$MNT/$1" "$2" --seed "$SEED" --direct) ||
		fail "$3: $out (seed $SEED)"
	echo "   $3: $out"
}

evict() {
	echo "evict /$1" >"$MNT/.tensorfs/ctl" || fail "evict /$1 through .tensorfs/ctl failed"
}

fault_off
tfs_mount "$OPTS"
fault_check_build

echo "1. half the attempts answered 503"
fault_set "dev=s3,err=503,rate=0.5,seed=$SEED"
out=$(python3 "$FAULTIO" write "$MNT/a" "$T/a.log" 6 "$SEED" --allow "") ||
	fail "part 1: a call failed although every 503 is retried: $out"
echo "   $out"
evict a
strict_read a "$T/a.log" "part 1"
[ "$(fault_count)" -gt 0 ] || fail "part 1: no fault was injected"
fault_alive "part 1"

echo "2. 30% of GETs fail"
# Without readahead every GET is a demand read, so every failure must reach
# the reader; a failed readahead is only retried by the read that follows.
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_mount "$OPTS,readahead=0,prefetch=off"
fault_set "dev=s3,op=read,err=EIO,rate=0.3,seed=$SEED"
errors=0
for i in 1 2 3; do
	evict a
	out=$(python3 "$FAULTIO" read "$MNT/a" "$T/a.log" --allow EIO --seed "$i" --direct) ||
		fail "part 2: wrong data under GET faults: $out (seed $SEED)"
	echo "   $out"
	errors=$((errors + $(json_get "$out" error)))
done
[ "$errors" -gt 0 ] || fail "part 2: no read failed"
fault_off
evict a
strict_read a "$T/a.log" "part 2, faults off"
fault_alive "part 2"

echo "3. 30% of PUTs fail"
fault_set "dev=s3,op=write,err=EIO,rate=0.3,seed=$SEED"
out=$(python3 "$FAULTIO" write "$MNT/b" "$T/b.log" 6 "$SEED" --allow EIO,ENOSPC) ||
	fail "part 3: $out"
echo "   $out"
fault_alive "part 3"
fault_off
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_fsck
tfs_mount "$OPTS"
strict_read b "$T/b.log" "part 3, after a remount"

echo "4. every request stalls 100 ms"
before=$(fault_count)
fault_set "dev=s3,op=any,err=delay,ms=100"
fio_py write "$MNT/c" "$T/c.log" 3 "$SEED" --allow "" >/dev/null
evict c
strict_read c "$T/c.log" "part 4"
[ "$(fault_count)" -gt "$before" ] || fail "part 4: no delay was injected"
fault_off
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_fsck
tfs_mount "$OPTS"
strict_read a "$T/a.log" "all, after a remount"
strict_read c "$T/c.log" "all, after a remount"
tfs_umount || fail "tensorfs exited $? at unmount"
s3_secret_leaks "$LOG"

echo "PASS: s3 faults (seed $SEED), $(fault_count) faults injected"
exit 0
