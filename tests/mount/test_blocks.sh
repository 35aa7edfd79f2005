#!/bin/bash
# st_blocks counts the blocks a file holds, never its size: a sparse 1 GiB
# file holds nothing, a 3-byte file one whole block, a hole in the middle
# nothing; a block shared by copy_file_range counts in both files (as du
# counts reflinked extents on XFS), and df counts it once; a block of
# zeros is counted while it is dirty in DRAM and not once it is written
# back as a hole; truncate and punch give blocks back. stat, du, tfsctl
# where's "allocated" (found by walking the block map) and df agree before
# and after write-back, across a remount and a kill -9, and fsck finds the
# stored counts right. Space another process takes shrinks df's size, not
# its used; two nvme folders on one filesystem are warned of, and its free
# space counts once.
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

MB=$((1 << 20))
BS=$MB # the default block size

blocks() { stat -c %b "$1"; }                         # 512-byte units
du_bytes() { du -B1 "$1" | cut -f1; }
allocated() {
	"$TFSCTL" where --json "$1" >"$T/where.out" 2>&1 || fail "tfsctl where $1: $(cat "$T/where.out")"
	python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["allocated"])' "$T/where.out"
}
df_used() {
	python3 -c 'import os,sys; s=os.statvfs(sys.argv[1]); print((s.f_blocks-s.f_bfree)*s.f_frsize)' "$MNT"
}
flush() {
	"$TFSCTL" -m "$MNT" flush >"$T/flush.out" 2>&1 || fail "tfsctl flush: $(cat "$T/flush.out")"
	sleep 1.2 # the kernel keeps attributes for attr_timeout (1 s)
}

# holds FILE NBLOCKS WHEN: stat, du and where all say FILE holds NBLOCKS blocks.
holds() {
	local f=$1 n=$2 when=$3 b d a
	b=$(blocks "$MNT/$f")
	d=$(du_bytes "$MNT/$f")
	a=$(allocated "$MNT/$f")
	[ "$b" -eq $((n * BS / 512)) ] || fail "$f ($when): st_blocks $b, want $((n * BS / 512)) ($n blocks)"
	[ "$d" -eq $((n * BS)) ] || fail "$f ($when): du says $d bytes, want $((n * BS))"
	[ "$a" -eq $((n * BS)) ] || fail "$f ($when): where says allocated $a, want $((n * BS))"
}

# the files and the blocks each holds
check_all() {
	holds sparse 0 "$1"
	holds small 1 "$1"
	holds odd 4 "$1"
	holds holey 2 "$1"
}

# df's used space grew by exactly BYTES since $BASE.
df_grew() {
	local used
	used=$(df_used)
	[ $((used - BASE)) -eq "$1" ] || fail "df: used grew by $((used - BASE)), want $1 ($2)"
}

tfs_mount
BASE=$(df_used)

truncate -s 1G "$MNT/sparse" || fail "truncate"
printf abc >"$MNT/small" || fail "writing small"
# The last byte is not zero: random, it was 1 time in 256, and the last
# block, all zeros, was rightly written back as a hole (3 blocks, not 4).
{ head -c $((3 * MB)) /dev/urandom && printf x; } >"$MNT/odd" || fail "writing odd"
dd if=/dev/urandom of="$MNT/holey" bs=1M count=1 status=none || fail "writing holey"
dd if=/dev/urandom of="$MNT/holey" bs=1M count=1 seek=10 conv=notrunc status=none ||
	fail "writing holey's second block"
[ "$(stat -c %s "$MNT/holey")" -eq $((11 * MB)) ] || fail "holey has the wrong size"

# Dirty in DRAM, never written back: counted all the same.
check_all "dirty"
df_grew $((7 * BS)) "dirty"
[ "$(du -s -B1 "$MNT" | cut -f1)" -eq $((7 * BS)) ] || fail "du of the mount: $(du -s -B1 "$MNT")"
[ "$(allocated "$MNT")" -eq $((7 * BS)) ] || fail "where of the mount: $(cat "$T/where.out")"

flush
check_all "written back"
df_grew $((7 * BS)) "written back"

# Space another process takes on the nvme folder's disk shrinks the size,
# not what df says this store uses.
head -c $((64 * MB)) /dev/zero >"$T/filler" || fail "writing the filler"
sync "$T/filler"
sleep 2 # the device looks at its filesystem's room now and then
df_grew $((7 * BS)) "another process took 64 MiB of the disk"
rm -f "$T/filler"

# A copy shares odd's blocks: du counts them in both files, df once. The
# last, partial block is copied as bytes, and dedup makes it shared too.
python3 - "$MNT/odd" "$MNT/odd.copy" <<'PY' || fail "copy_file_range"
import os, sys
src = os.open(sys.argv[1], os.O_RDONLY)
dst = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o644)
left = os.fstat(src).st_size
off = 0
while left:
    n = os.copy_file_range(src, dst, left, off, off)
    assert n > 0
    off += n
    left -= n
PY
holds odd.copy 4 "copied"
flush
holds odd.copy 4 "copied, written back"
cmp -s "$MNT/odd" "$MNT/odd.copy" || fail "the copy reads back wrong"
df_grew $((7 * BS)) "after copying odd"
[ "$(du -s -B1 "$MNT" | cut -f1)" -eq $((11 * BS)) ] || fail "du of the mount after the copy"

# Zeros are held while dirty, and become holes at write-back.
dd if=/dev/zero of="$MNT/zeros" bs=1M count=2 status=none || fail "writing zeros"
holds zeros 2 "zeros, dirty"
flush
holds zeros 0 "zeros, written back"

# truncate and punch give blocks back.
truncate -s $((3 * MB / 2)) "$MNT/odd.copy" || fail "truncate odd.copy"
holds odd.copy 2 "truncated to 1.5 MiB"
fallocate -p -o 0 -l $MB "$MNT/holey" || fail "punching holey"
holds holey 1 "punched"
truncate -s $((20 * MB)) "$MNT/holey" || fail "growing holey"
holds holey 1 "grown"

# The counts are stored: they survive a remount...
tfs_umount || fail "unmount failed"
tfs_mount
holds sparse 0 "remounted"
holds small 1 "remounted"
holds odd 4 "remounted"
holds odd.copy 2 "remounted"
holds holey 1 "remounted"
holds zeros 0 "remounted"

# ...and a kill -9 after a flush.
head -c $((5 * MB)) /dev/urandom >"$MNT/late" || fail "writing late"
rm "$MNT/odd" || fail "rm odd"
flush
tfs_kill9
tfs_mount
holds late 5 "after kill -9"
holds odd.copy 2 "after kill -9"
tfs_umount || fail "unmount failed"

"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
grep -q '^fsck: clean$' "$T/fsck.out" || fail "fsck: $(cat "$T/fsck.out")"

# Two nvme folders on one filesystem: a warning at mount, and df counts its
# free space once (regression: twice, so df promised space no disk had).
mkdir -p "$T/same-a" "$T/same-b"
: >"$LOG"
NVME="$T/same-a:$T/same-b" META="$T/same-meta" tfs_mount
grep -q "nvme folders $T/same-a and $T/same-b are on one filesystem" "$LOG" ||
	fail "no warning for two nvme folders on one filesystem: $(cat "$LOG")"
python3 - "$MNT" "$T" <<'PY' || fail "df of two folders on one filesystem"
import os, sys
m, d = os.statvfs(sys.argv[1]), os.statvfs(sys.argv[2])
mount_free, disk_free = m.f_bavail * m.f_frsize, d.f_bavail * d.f_frsize
# the mount may hold a little of its slabs' own space on top (a few blocks)
if mount_free > disk_free + (64 << 20):
    sys.exit(f"df says {mount_free >> 20} MiB free on the mount, the disk has {disk_free >> 20} MiB")
print(f"   two folders on one disk: {mount_free >> 20} MiB free on the mount, {disk_free >> 20} MiB on the disk")
PY
tfs_umount || fail "unmount of the two-folder store failed"
exit 0
