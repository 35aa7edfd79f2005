#!/bin/bash
# Deduplication at write-back: identical blocks are stored once, overwrites
# un-share only what changed, deleting frees everything (also across a
# remount and a kill -9), verify mode never merges different bytes even when
# their hashes collide, dedup=off stores every copy, verify compares with
# the stored copy in DRAM when it is there, and a write-back batch whose
# commits drop a block that another of its blocks shares still commits.
. "$(dirname "$0")/lib.sh"

SIZE_MB=${DEDUP_MB:-256}
MB=$((1 << 20))
head -c $((SIZE_MB * MB)) /dev/urandom >"$T/src" || fail "cannot make source data"

stat_val() { tfs_stat_json "$@" || fail "stats unreadable"; }

# Wait until a stats value satisfies a python condition on v (bounded).
wait_stat() {
	local cond=$1 i v
	shift
	for i in $(seq 1 100); do
		v=$(stat_val "$@")
		python3 -c "import sys; v=int(sys.argv[1]); sys.exit(0 if ($cond) else 1)" "$v" &&
			return 0
		sleep 0.1
	done
	fail "stats $* = $v never satisfied: $cond"
}

# write_copies N: N files with the same bytes, written through write(2)
# (dd, not cp: cp would share blocks through copy_file_range instead).
write_copies() {
	local i
	for i in $(seq 1 "$1"); do
		dd if="$T/src" of="$MNT/copy$i" bs=1M conv=fsync status=none ||
			fail "writing copy$i"
	done
}

check_copies() {
	local i
	for i in $(seq 1 "$1"); do
		cmp -s "$T/src" "$MNT/copy$i" || fail "copy$i reads back wrong ($2)"
	done
}

# near A B: A within 5% of B (both bytes).
near() {
	python3 -c "import sys; a,b=int(sys.argv[1]),int(sys.argv[2]); sys.exit(0 if abs(a-b) <= 0.05*b + (2<<20) else 1)" "$1" "$2"
}

# 1. Four identical files store about one copy.
TFS_DRAM=256M tfs_mount
write_copies 4
check_copies 4 "after writing"
phys=$(stat_val dedup physical_bytes)
logical=$(stat_val dedup logical_bytes)
near "$phys" $((SIZE_MB * MB)) || fail "4 identical files store $phys bytes, want about $((SIZE_MB * MB))"
near "$logical" $((4 * SIZE_MB * MB)) || fail "logical bytes $logical, want $((4 * SIZE_MB * MB))"
[ "$(stat_val dedup hits)" -ge $((3 * SIZE_MB * 9 / 10)) ] || fail "too few dedup hits"

# 2. Overwriting 8 MiB of one copy un-shares only those blocks.
head -c $((8 * MB)) /dev/urandom >"$T/patch"
dd if="$T/patch" of="$MNT/copy2" bs=1M seek=16 conv=notrunc,fsync status=none || fail "patch"
phys2=$(stat_val dedup physical_bytes)
near "$phys2" $(((SIZE_MB + 8) * MB)) || fail "after an 8 MiB overwrite: $phys2 bytes stored"
cp "$T/src" "$T/want2" && dd if="$T/patch" of="$T/want2" bs=1M seek=16 conv=notrunc status=none
cmp -s "$T/want2" "$MNT/copy2" || fail "the overwritten copy reads back wrong"
for i in 1 3 4; do cmp -s "$T/src" "$MNT/copy$i" || fail "copy$i changed with copy2"; done

# 3. Remount: sharing and data persist; deleting everything frees it all.
tfs_umount || fail "unmount"
tfs_mount
check_copies 1 "after remount"
cmp -s "$T/want2" "$MNT/copy2" || fail "copy2 after remount"
rm -f "$MNT"/copy*
wait_stat "v == 0" tiers nvme0 used
wait_stat "v == 0" dedup physical_bytes

# 4. kill -9 with shared blocks committed: nothing lost, nothing leaked.
write_copies 3
tfs_kill9
tfs_mount
check_copies 3 "after kill -9"
near "$(stat_val dedup physical_bytes)" $((SIZE_MB * MB)) || fail "sharing lost across kill -9"
rm -f "$MNT"/copy*
wait_stat "v == 0" tiers nvme0 used
tfs_umount || fail "unmount"

# 5. Verify mode with every hash colliding: different bytes never merge.
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
TENSORFS_TEST_HASH_COLLIDE=1 tfs_mount
head -c $((32 * MB)) /dev/urandom >"$T/a"
head -c $((32 * MB)) /dev/urandom >"$T/b"
dd if="$T/a" of="$MNT/a" bs=1M conv=fsync status=none || fail "write a"
dd if="$T/b" of="$MNT/b" bs=1M conv=fsync status=none || fail "write b"
cmp -s "$T/a" "$MNT/a" || fail "colliding hashes: a reads back wrong"
cmp -s "$T/b" "$MNT/b" || fail "colliding hashes: b merged with a"
[ "$(stat_val dedup verify_mismatches)" -gt 0 ] || fail "the collision hook did not collide"
near "$(stat_val dedup physical_bytes)" $((64 * MB)) || fail "colliding blocks were merged"
tfs_umount || fail "unmount"

# 6. dedup=off stores every copy.
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
head -c $((32 * MB)) "$T/src" >"$T/small" && mv "$T/small" "$T/src"
tfs_mount dedup=off
SIZE_MB=32 write_copies 2
[ "$(stat_val dedup hits)" -eq 0 ] || fail "dedup=off shared blocks"
near "$(stat_val dedup physical_bytes)" $((64 * MB)) || fail "dedup=off: not every copy stored"
tfs_umount || fail "unmount"
# 7. Verify compares with the stored copy in DRAM when it is cached: a copy
#    of a file still in DRAM dedups without reading the device.
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
tfs_mount
dd if="$T/src" of="$MNT/orig" bs=1M conv=fsync status=none || fail "write orig"
r0=$(stat_val tiers nvme0 read_bytes)
dd if="$MNT/orig" of="$MNT/dup" bs=1M conv=fsync status=none || fail "copy orig"
r1=$(stat_val tiers nvme0 read_bytes)
cached=$(stat_val dedup verify_from_dram)
cmp -s "$T/src" "$MNT/dup" || fail "the dedup'd copy reads back wrong"
[ "$cached" -ge 30 ] || fail "verify compared $cached of 32 blocks with the DRAM copy"
[ "$r1" -eq "$r0" ] || fail "verify read $((r1 - r0)) bytes from the device with the copy in DRAM"
near "$(stat_val dedup physical_bytes)" $((32 * MB)) || fail "the copy was not shared"
tfs_umount || fail "unmount"
# 8. One write-back batch whose commits drop the last reference of a block
#    that another block of the batch shares. fsync commits both blocks of
#    f together (dirty_expire_ms keeps them dirty until then). (a) Block 0
#    zeroed (a hole) and its bytes written to block 1: the share is
#    committed first, so it holds (one hit more). (b) Two blocks swapping
#    their bytes: each share drops the block the other shares; the batch is
#    written again with both stored whole. Either once made the flusher
#    write the batch again for ever, and the fsync never returned.
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
tfs_mount dirty_expire_ms=600000
head -c $((2 * MB)) /dev/urandom >"$T/cd"
dd if="$T/cd" of="$MNT/f" bs=1M conv=fsync status=none || fail "write f"
h0=$(stat_val dedup hits)
dd if=/dev/zero of="$MNT/f" bs=1M count=1 conv=notrunc status=none || fail "zero block 0"
dd if="$T/cd" of="$MNT/f" bs=1M count=1 seek=1 conv=notrunc status=none || fail "block 0's bytes to block 1"
within 60 python3 -c "import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDWR))" "$MNT/f" ||
	{ tfs_stacks; fail "(a) fsync of a hole and a share of the block it drops: not done in 60 s"; }
[ "$(stat_val dedup hits)" -eq $((h0 + 1)) ] || fail "(a) the share was not committed ahead of the hole"
{ head -c "$MB" /dev/zero; head -c "$MB" "$T/cd"; } >"$T/want8a"
head -c $((2 * MB)) /dev/urandom >"$T/cd" # bytes no other block has
dd if="$T/cd" of="$MNT/g" bs=1M conv=fsync status=none || fail "write g"
dd if="$T/cd" of="$MNT/g" bs=1M skip=1 count=1 conv=notrunc status=none || fail "g: block 1 to 0"
dd if="$T/cd" of="$MNT/g" bs=1M count=1 seek=1 conv=notrunc status=none || fail "g: block 0 to 1"
within 60 python3 -c "import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDWR))" "$MNT/g" ||
	{ tfs_stacks; fail "(b) fsync of two blocks that swapped their bytes: not done in 60 s"; }
{ tail -c "$MB" "$T/cd"; head -c "$MB" "$T/cd"; } >"$T/want8b"
tfs_umount || fail "unmount"
tfs_mount
cmp -s "$T/want8a" "$MNT/f" || fail "(a) f reads back wrong after remount"
cmp -s "$T/want8b" "$MNT/g" || fail "(b) g reads back wrong after remount"
tfs_umount || fail "unmount"
echo "PASS: dedup (${SIZE_MB} MiB copies)"
