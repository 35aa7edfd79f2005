#!/bin/bash
# Fault injection on the write side: failed writes, syncs and ENOSPC from
# the nvme devices are retried to success or reach the application as an
# error, never as wrong data; the daemon stays up; the store stays
# consistent (tfsctl fsck).
#
#   1. Two nvme folders, nvme0 failing 30% of its writes with EIO: every
#      fsync succeeds (write-back tries again, nvme1 takes the blocks).
#   2. One folder failing its first 2 writes (fewer than take a device
#      down), then a flush failing once: write-back is retried to success;
#      one fsync fails with EIO, for the flush; nothing is lost.
#   3. One folder failing every write: fsync must fail with EIO, and so
#      must write() once the device is down: an I/O error, not "no space"
#      (regression: both said ENOSPC while the only device was down). Once
#      the device heals, the blocks are written back.
#   4. One folder answering ENOSPC to its first 3 writes in a row, then
#      to half of the next ones: write or fsync succeeds or fails with
#      ENOSPC, never EIO (regression: 3 in a row put the device down, and
#      its writers saw EIO); once the faults end, the device takes new
#      blocks again within seconds. (Regression: it stayed full until one
#      of its own blocks was freed, which may be never.)
#   5. nvme (capped) plus a pfs folder (the thread pool engine) failing half its
#      writes: writes succeed; then half its reads: reads are right or EIO.
# After each part: a clean unmount, fsck, a remount and a strict read-back.
# FAULT_SEED picks the random choices (printed).

. "$(dirname "$0")/lib_fault.sh"

SEED=${FAULT_SEED:-$((RANDOM << 15 | RANDOM))}
echo "fault write test, seed $SEED"

# check_all DIR LOG: every file reads back exactly, no error allowed.
check_all() {
	local out
	out=$(python3 "$FAULTIO" read "$MNT/$1" "$2" --seed "$SEED") ||
		fail "read-back after the faults: $out (seed $SEED)"
	echo "   read back: $out"
}

# remount_check DIR LOG: clean unmount, fsck, remount, strict read-back.
remount_check() {
	fault_off
	tfs_umount || fail "tensorfs exited $? at unmount"
	tfs_fsck
	tfs_mount "${MOUNT_OPTS:-}"
	check_all "$1" "$2"
}

echo "1. nvme0 fails 30% of its writes; nvme1 is healthy"
NVME1="$T/nvme1"
mkdir -p "$NVME1"
fault_off
NVME_SAVE=$NVME
NVME="$NVME:$NVME1"
tfs_mount
fault_check_build
fault_set "dev=nvme0,op=write,err=EIO,rate=0.3,seed=$SEED"
out=$(python3 "$FAULTIO" write "$MNT/d" "$T/w1.log" 16 "$SEED" --allow "") ||
	fail "part 1: a write or fsync failed although nvme1 could take every block: $out"
echo "   $out"
[ "$(fault_count)" -gt 0 ] || fail "part 1: no fault was injected"
fault_alive "part 1"
[ "$(tfs_stat_json tiers nvme0 errors)" -gt 0 ] || fail "part 1: nvme0 counts no error"
remount_check d "$T/w1.log"
tfs_umount || fail "tensorfs exited $? at unmount"
NVME=$NVME_SAVE

# A store of one folder for the other parts.
NVME="$T/solo"
META="$T/solo-meta"
mkdir -p "$NVME"

echo "2. the only folder fails its first 2 writes, then one flush"
fault_off
tfs_mount
before=$(fault_count)
fault_set "op=write,err=EIO,count=2,seed=$SEED" "op=sync,err=EIO,count=1"
out=$(python3 "$FAULTIO" write "$MNT/d" "$T/w2.log" 6 "$SEED" --allow EIO) ||
	fail "part 2: $out"
echo "   $out"
[ "$(json_get "$out" write_EIO)" -eq 0 ] || fail "part 2: write() failed: write-back errors belong to fsync"
[ "$(json_get "$out" fsync_ok)" -ge 5 ] ||
	fail "part 2: more than one fsync failed although only 2 writes and 1 flush did"
[ "$(json_get "$out" fsync_EIO)" -le 1 ] || fail "part 2: $out"
[ $(($(fault_count) - before)) -eq 3 ] || fail "part 2: expected 3 injected faults, got $(($(fault_count) - before))"
fault_alive "part 2"
remount_check d "$T/w2.log"

echo "3. the only folder fails every write: fsync must fail"
before=$(fault_count)
fault_set "op=write,err=EIO"
start=$(date +%s)
out=$(python3 "$FAULTIO" write "$MNT/d3" "$T/w3.log" 1 "$SEED" --min 2097152 --max 2097152 \
	--allow EIO) || fail "part 3: $out"
echo "   $out after $(($(date +%s) - start)) s"
[ "$(json_get "$out" fsync_ok)" -eq 0 ] ||
	fail "part 3: fsync succeeded while every write failed: $out"
[ "$(fault_count)" -gt "$before" ] || fail "part 3: no fault was injected"
fault_alive "part 3"
# The device heals: the dirty blocks are still there and go out.
remount_check d3 "$T/w3.log"

echo "4. the only folder answers ENOSPC to 3 writes in a row, then to half its writes"
before=$(fault_count)
fault_set "op=write,err=ENOSPC,count=3" "op=write,err=ENOSPC,rate=0.5,count=3,seed=$SEED"
out=$(python3 "$FAULTIO" write "$MNT/d4" "$T/w4.log" 8 "$SEED" --allow ENOSPC) ||
	fail "part 4: $out"
echo "   $out"
[ "$(fault_count)" -gt "$before" ] || fail "part 4: no fault was injected"
[ "$(tfs_stat_json tiers nvme0 state)" != down ] || fail "part 4: ENOSPC put nvme0 down"
fault_alive "part 4"
fault_off
# A device that said ENOSPC must take new blocks again after a while (its
# filesystem may be shared: others free space too), not only once one of
# its own blocks is freed. Regression: it stayed full for good.
w0=$(tfs_stat_json tiers nvme0 write_ops)
for i in $(seq 1 20); do
	rm -rf "$MNT/d4b" "$T/w4b.log"
	out=$(python3 "$FAULTIO" write "$MNT/d4b" "$T/w4b.log" 2 "$SEED" --allow ENOSPC) ||
		fail "part 4: $out"
	[ "$(json_get "$out" write_ok)" -eq 2 ] && [ "$(json_get "$out" fsync_ok)" -eq 2 ] && break
	sleep 1
done
[ "$(json_get "$out" write_ok)" -eq 2 ] && [ "$(json_get "$out" fsync_ok)" -eq 2 ] ||
	fail "part 4: still ENOSPC 20 s after the injected ENOSPC faults ended: $out"
echo "   writes work again after $i attempt(s)"
[ "$(tfs_stat_json tiers nvme0 write_ops)" -gt "$w0" ] ||
	fail "part 4: nvme0 wrote nothing for the new files"
remount_check d4 "$T/w4.log"
check_all d4b "$T/w4b.log"
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_fsck

echo "5. a pfs folder (thread engine) fails half its writes, then half its reads"
NVME="$T/p-nvme"
META="$T/p-meta"
mkdir -p "$NVME" "$T/pfs"
# nvme0 capped below what the pfs folder (the same disk) shows: placement
# weighs devices by what they can do, so pfs takes most new blocks and the
# faults below are certain to meet some (with both uncapped, pfs could get
# none of d5b's few blocks and the test saw no fault).
MOUNT_OPTS="remote=$T/pfs,nvme_bw=40M"
tfs_mount "$MOUNT_OPTS"
fio_py write "$MNT/d5" "$T/w5.log" 8 "$SEED" --allow "" >/dev/null
[ "$(tfs_stat_json tiers pfs used)" -gt 0 ] || fail "part 5: pfs holds no block"
fault_set "dev=pfs,op=write,err=EIO,rate=0.5,seed=$SEED"
# 16 files of 1 byte to 3 MiB: about 30 blocks, most of them placed on pfs,
# each drawing a fault at odds of one half, so that no seed meets none.
out=$(python3 "$FAULTIO" write "$MNT/d5b" "$T/w5b.log" 16 "$SEED" --allow "") ||
	fail "part 5: a call failed although nvme0 could take every block: $out"
echo "   writes: $out"
grep -q "fault injected: pfs write" "$LOG" || fail "part 5: no pfs write fault was injected"
fault_set "dev=pfs,op=read,err=EIO,rate=0.5,seed=$SEED"
for i in 1 2 3; do
	echo "evict /d5" >"$MNT/.tensorfs/ctl" || fail "part 5: evict failed"
	out=$(python3 "$FAULTIO" read "$MNT/d5" "$T/w5.log" --allow EIO --direct --seed "$i") ||
		fail "part 5: wrong data under pfs read faults: $out"
	echo "   reads: $out"
done
grep -q "fault injected: pfs read" "$LOG" || fail "part 5: no pfs read fault was injected"
fault_alive "part 5"
remount_check d5 "$T/w5.log"
check_all d5b "$T/w5b.log"
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_fsck

echo "PASS: write faults (seed $SEED), $(fault_count) faults injected"
exit 0
