#!/bin/bash
# Fault injection on the read side: a device read that fails reaches the
# reader as EIO, never as wrong bytes, and leaves nothing behind: once the
# faults end, every byte reads right. The daemon stays up and the store
# stays consistent (tfsctl fsck).
#
#   1. Files written cleanly, then read cold (evicted, no readahead) while
#      30% of the device's reads fail: by two threads, buffered and O_DIRECT,
#      in chunks of 1 byte to 3 MiB. Every chunk is right (or a short count
#      of right bytes) or EIO; some are EIO.
#   2. Faults off: every chunk reads right (no failed load stays cached).
#   3. Unaligned overwrites of blocks that are persisted and not cached,
#      under read faults: completing such a block needs a read, which fails
#      now and then; write-back must retry it, and what fsync accepted must
#      be there after a remount. Copies of stored files are written too:
#      dedup's verify read fails now and then, which must not share blocks
#      whose bytes were not compared.
#   4. Reads and writes that stall (delays of 50 ms) all succeed.
# FAULT_SEED picks the random choices (printed).

. "$(dirname "$0")/lib_fault.sh"

SEED=${FAULT_SEED:-$((RANDOM << 15 | RANDOM))}
echo "fault read test, seed $SEED"

strict_read() {
	local out
	out=$(python3 "$FAULTIO" read "$MNT/$1" "$2" --seed "$SEED" --passes "${3:-1}") ||
		fail "$4: $out (seed $SEED)"
	echo "   $4: $out"
}

fault_off
tfs_mount
fault_check_build
fio_py write "$MNT/d" "$T/r.log" 12 "$SEED" --allow "" >/dev/null
tfs_umount || fail "tensorfs exited $? at unmount"
# Without readahead every device read is a demand read, so every failure
# must reach the reader (a failed readahead is retried by the read after).
tfs_mount "readahead=0,prefetch=off"

# drop the files' blocks from DRAM, so that the next reads go to the device
evict() {
	echo "evict /$1" >"$MNT/.tensorfs/ctl" || fail "evict /$1 through .tensorfs/ctl failed"
}

echo "1. cold reads while 30% of the device's reads fail"
errors=0
for mode in "" --direct "" --direct; do
	evict d
	fault_set "op=read,err=EIO,rate=0.3,seed=$((SEED + errors))"
	out=$(python3 "$FAULTIO" read "$MNT/d" "$T/r.log" --allow EIO --threads 2 \
		--seed "$SEED" $mode) || fail "part 1: wrong data under read faults: $out (seed $SEED)"
	echo "   ${mode:-buffered}: $out"
	[ "$(json_get "$out" ok)" -gt 0 ] || fail "part 1: no read succeeded at all"
	errors=$((errors + $(json_get "$out" error)))
done
[ "$errors" -gt 0 ] || fail "part 1: no read failed although $(fault_count) faults were injected"
[ "$(fault_count)" -gt 0 ] || fail "part 1: no fault was injected"
fault_alive "part 1"

echo "2. faults off: everything reads right"
fault_off
strict_read d "$T/r.log" 2 "part 2"

echo "3. unaligned overwrites and copies of uncached blocks under read faults"
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_fsck
tfs_mount
before=$(fault_count)
fault_set "op=read,err=EIO,rate=0.3,seed=$((SEED + 1))"
out=$(python3 "$FAULTIO" patch "$MNT/d" "$T/r.log" "$SEED" --allow EIO) || fail "part 3: $out"
echo "   patches: $out"
# the same bytes again under another name: candidates for dedup
mkdir -p "$MNT/dup"
for f in "$MNT"/d/f000[0-5]; do
	cp "$f" "$MNT/dup/" 2>/dev/null || true
done
sync -f "$MNT/dup" 2>/dev/null || true
[ "$(fault_count)" -gt "$before" ] || fail "part 3: no fault was injected"
fault_alive "part 3"
fault_off
tfs_umount || fail "tensorfs exited $? at unmount: write-back did not finish once reads worked"
tfs_fsck
tfs_mount
strict_read d "$T/r.log" 1 "part 3 read-back"
for f in "$MNT"/dup/*; do
	cmp -s "$f" "$MNT/d/$(basename "$f")" || fail "part 3: copy $(basename "$f") differs from its source"
done

echo "4. reads and writes stall"
before=$(fault_count)
fault_set "op=read,err=delay,ms=50,rate=0.5,seed=$SEED" "op=write,err=delay,ms=50,rate=0.5,seed=$SEED"
# 12 files of at least a block each: at least 12 device writes, and 12
# reads after the remount, each delayed with odds of one half. With 4 files
# of random size, seed 843450867 made 4 blocks, none of which drew a delay.
fio_py write "$MNT/slow" "$T/s.log" 12 "$SEED" --allow "" >/dev/null
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_mount
strict_read slow "$T/s.log" 1 "part 4"
[ "$(fault_count)" -gt "$before" ] || fail "part 4: no delay was injected"
fault_off
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_fsck

echo "PASS: read faults (seed $SEED), $(fault_count) faults injected"
exit 0
