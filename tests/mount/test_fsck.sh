#!/bin/bash
# tfsctl fsck on the metadata store of a stopped mount: clean after normal
# use (hard links, folders moved about, shared and deduplicated blocks,
# xattrs, symlinks) and after a kill -9; refused while the store is in use.
# Then the store is damaged on purpose (metacorrupt): a block record
# deleted, a refcount bumped, a leaked block, two blocks at one location, a
# name deleted, a file's count of mapped blocks (its st_blocks) wrong. fsck names each problem and exits 1; --repair fixes them,
# lists what it did, and leaves a store that checks clean and mounts, where
# every file reads back as before except the range whose block was lost,
# which reads as zeros.
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
: "${METACORRUPT:?METACORRUPT must name the metacorrupt program}"

MB=$((1 << 20))
OUT="$T/fsck.out"

# fsck [--repair]: run it on $META; output in $OUT, status returned.
fsck() {
	"$TFSCTL" fsck "$@" "$META" >"$OUT" 2>&1
}

fsck_clean() {
	local rc=0
	fsck || rc=$?
	[ $rc -eq 0 ] || fail "fsck ($1): exit $rc: $(cat "$OUT")"
	tail -n 1 "$OUT" | grep -qx 'fsck: clean' || fail "fsck ($1) does not end clean: $(cat "$OUT")"
}

# has PATTERN: fsck's output names the problem.
has() {
	grep -qE -e "$1" "$OUT" || fail "fsck output lacks '$1': $(cat "$OUT")"
}

ino() { stat -c %i "$1" || fail "stat $1"; }

export TFS_DRAM=128M TFS_THREADS=4

# --- 1. normal use -----------------------------------------------------------
tfs_mount
head -c $((8 * MB)) /dev/urandom >"$T/a.ref"
head -c $((6 * MB)) /dev/urandom >"$T/v.ref"
cp "$T/a.ref" "$MNT/a"
cp "$T/v.ref" "$MNT/v"
cp "$MNT/a" "$MNT/a.copy" # copy_file_range: shared blocks
dd if="$T/a.ref" of="$MNT/a.dup" bs=1M status=none || fail "a.dup" # dedup
mkdir -p "$MNT/d1/d2" "$MNT/d3"
head -c $((3 * MB)) /dev/urandom >"$T/f.ref"
cp "$T/f.ref" "$MNT/d1/d2/f"
ln "$MNT/d1/d2/f" "$MNT/d3/f.link"
mv "$MNT/d1/d2" "$MNT/d3/d2"
mkdir "$MNT/gone" && rmdir "$MNT/gone"
ln -s a "$MNT/sym"
setfattr -n user.note -v hello "$MNT/a" 2>/dev/null || python3 -c \
	'import os,sys; os.setxattr(sys.argv[1], "user.note", b"hello")' "$MNT/a"
echo small >"$MNT/d3/small"
rm "$MNT/d3/small"
sync
sums=$(cd "$MNT" && md5sum a a.copy a.dup)
cmp -s "$T/f.ref" "$MNT/d3/f.link" || fail "f.link does not read f"
A_INO=$(ino "$MNT/a") V_INO=$(ino "$MNT/v") F_INO=$(ino "$MNT/d3/d2/f")

# In use: refused, with status 8 and a message.
rc=0
fsck || rc=$?
[ $rc -eq 8 ] || fail "fsck of a store in use: exit $rc, want 8"
grep -q 'in use' "$OUT" || fail "fsck of a store in use: $(cat "$OUT")"
tfs_umount || fail "unmount"
fsck_clean "after normal use"
grep -qE '^fsck: .*: block size 1048576, [0-9]+ inodes \([0-9]+ files, 4 folders\)' "$OUT" ||
	fail "fsck summary: $(head -1 "$OUT")"

# --- 2. kill -9, with a file deleted while open ----------------------------
tfs_mount
dd if=/dev/urandom of="$MNT/late" bs=1M count=4 conv=fsync status=none || fail "late"
dd if=/dev/urandom of="$MNT/open-deleted" bs=1M count=2 conv=fsync status=none || fail "od"
exec 3<"$MNT/open-deleted"
rm "$MNT/open-deleted"
dd if=/dev/urandom of="$MNT/unsynced" bs=1M count=2 status=none || fail "unsynced"
tfs_kill9
exec 3<&-
fsck_clean "after kill -9"
has '^note: inode [0-9]+ \(file, 2097152 bytes\) was deleted while open'

# --- 3. damage, find, repair ---------------------------------------------------
# A lost block record: the mapping names nothing, the dedup index too.
"$METACORRUPT" "$META" del-block "$V_INO" 3 >/dev/null || fail "metacorrupt del-block"
rc=0
fsck || rc=$?
[ $rc -eq 1 ] || fail "fsck of a store with a lost block: exit $rc, want 1: $(cat "$OUT")"
has "^missing-block: /v \\(ino $V_INO\\) block 3 \\(bytes 3145728\\.\\.4194303\\) names block [0-9]+, which does not exist$"
has '^fsck: [0-9]+ problems?$'

# More damage of other kinds, then one repair for all of it.
"$METACORRUPT" "$META" bump-refs "$A_INO" 0 >/dev/null || fail "metacorrupt bump-refs"
"$METACORRUPT" "$META" set-count "$A_INO" 99 >/dev/null || fail "metacorrupt set-count"
"$METACORRUPT" "$META" leak >/dev/null || fail "metacorrupt leak"
"$METACORRUPT" "$META" share-loc "$A_INO" 5 "$F_INO" 1 >/dev/null || fail "metacorrupt share-loc"
"$METACORRUPT" "$META" del-name late >/dev/null || fail "metacorrupt del-name"
rc=0
fsck || rc=$?
[ $rc -eq 1 ] || fail "fsck of a damaged store: exit $rc, want 1"
has '^refcount: block [0-9]+ has refcount 4 but 3 references$'
has '^leaked: block [0-9]+ \(dev 0 slot [0-9]+\) has no references$'
has '^shared-location: blocks [0-9]+ and [0-9]+ are both at dev 0 slot [0-9]+$'
has '^orphan: inode [0-9]+ \(file, 4194304 bytes, nlink 1\) has no name$'
has '^stale-listing: / \(ino 1\) lists "late" \(cookie [0-9]+\) with no such name in it$'
has "^blocks: /a \\(ino $A_INO\\) records 99 mapped blocks, but maps 8$"

rc=0
fsck --repair || rc=$?
[ $rc -eq 0 ] || fail "fsck --repair: exit $rc: $(cat "$OUT")"
has "^  repair: mapping removed: bytes 3145728\\.\\.4194303 of /v \\(ino $V_INO\\) now read as zeros$"
has '^  repair: refcount of block [0-9]+ set to 3$'
has '^  repair: block [0-9]+ removed; its space is free at the next mount$'
has '^  repair: mappings of block [0-9]+ moved to block [0-9]+$'
has '^  repair: inode [0-9]+ purged with its data$'
has "^  repair: block count of /a \\(ino $A_INO\\) set to 8$"
has "^  repair: block count of /v \\(ino $V_INO\\) set to 5$"
has '^fsck: [0-9]+ problems, repaired; checking again$'
tail -n 1 "$OUT" | grep -qx 'fsck: clean' || fail "fsck --repair does not end clean: $(cat "$OUT")"
fsck_clean "after repair"

# The repaired store mounts; files read as before, v has a hole of zeros,
# and f's block 1 reads what it read since its location was shared.
tfs_mount
[ "$(cd "$MNT" && md5sum a a.copy a.dup)" = "$sums" ] || fail "files differ after repair"
cp "$T/f.ref" "$T/f.want"
dd if="$T/a.ref" of="$T/f.want" bs=1M skip=5 seek=1 count=1 conv=notrunc status=none
cmp "$T/f.want" "$MNT/d3/d2/f" || fail "f after repair: want a's block 5 as its block 1"
cmp -s "$MNT/d3/d2/f" "$MNT/d3/f.link" || fail "f and its hard link differ"
cp "$T/v.ref" "$T/v.want"
dd if=/dev/zero of="$T/v.want" bs=1M seek=3 count=1 conv=notrunc status=none
cmp "$T/v.want" "$MNT/v" || fail "v after repair: want its block 3 as zeros, the rest intact"
[ -e "$MNT/late" ] && fail "the name deleted by metacorrupt came back"
ls "$MNT" >/dev/null || fail "readdir of the root after repair"
# The space of the purged and leaked blocks is free again: new data fits and reads back.
head -c $((8 * MB)) /dev/urandom >"$T/new.ref"
cp "$T/new.ref" "$MNT/new" && sync "$MNT/new" || fail "writing after repair"
cmp -s "$T/new.ref" "$MNT/new" || fail "new file after repair"
tfs_umount || fail "unmount after repair"
fsck_clean "after using the repaired store"

# A stored length that is not whole KiB within the block: the daemon will
# not read the block (EIO, never other bytes), fsck reports it, and repair
# drops it, so that its range reads as zeros.
"$METACORRUPT" "$META" set-len "$V_INO" 1 1000 >/dev/null || fail "metacorrupt set-len"
tfs_mount
dd if="$MNT/v" of=/dev/null bs=1M skip=1 count=1 iflag=direct status=none 2>"$T/dd.err" &&
	fail "a block with a stored length of 1000 bytes was read"
grep -q "Input/output error" "$T/dd.err" || fail "bad length: want EIO, got: $(cat "$T/dd.err")"
tfs_umount || fail "unmount"
rc=0
fsck || rc=$?
[ $rc -eq 1 ] || fail "fsck of a block with a bad length: exit $rc, want 1"
has "^bad-length: block [0-9]+ stores 1000 bytes, not whole KiB within its 1048576$"
rc=0
fsck --repair || rc=$?
[ $rc -eq 0 ] || fail "fsck --repair of a bad length: exit $rc: $(cat "$OUT")"
fsck_clean "after repairing a bad length"
tfs_mount
dd if=/dev/zero of="$T/v.want" bs=1M seek=1 count=1 conv=notrunc status=none
cmp "$T/v.want" "$MNT/v" || fail "v after repair: want its block 1 as zeros too"
tfs_umount || fail "unmount"

# Usage and operational errors.
rc=0
"$TFSCTL" fsck >"$OUT" 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "fsck without META_DIR: exit $rc, want 2"
rc=0
"$TFSCTL" fsck "$T/no-such-store" >"$OUT" 2>&1 || rc=$?
[ $rc -eq 8 ] || fail "fsck of a missing store: exit $rc, want 8"
grep -q 'no tensorfs metadata store' "$OUT" || fail "missing store: $(cat "$OUT")"
[ -e "$T/no-such-store" ] && fail "fsck created a store"
echo "PASS: fsck"
