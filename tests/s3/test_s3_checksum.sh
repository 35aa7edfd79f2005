#!/bin/bash
# End-to-end checksums on the s3 tier: a block read from the bucket is
# checked against the hash its record keeps, as a block read from an nvme
# slab is (tests/mount/test_checksum.sh). An s3-only tier, 8 blocks per
# object: a 16 MiB file written and fsynced, then, the store unmounted, one
# byte of one stored object flipped in the server's folder, as a damaged
# disk under the object store would. Remounted, exactly one block of the
# file reads EIO, the others read back right, the log names the block, the
# s3 tier counts the error, and tfsctl scrub lists the block with exit
# status 1. On 2582941 the block reads back with its wrong byte and rc 0.
. "$(dirname "$0")/lib_s3.sh"

: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
export TFS_DRAM=64M TFS_THREADS=8
MB=$((1 << 20))
s3_start
NVME=none
mkdir -p "$META"
OPTS="$(s3_mount_opts sums),s3_object=8M"
OBJDIR="$S3_DATA/$S3_BUCKET/sums"

head -c $((16 * MB)) /dev/urandom >"$T/f" || fail "cannot make source data"
tfs_mount "$OPTS"
dd if="$T/f" of="$MNT/f" bs=1M conv=fsync status=none || fail "write f"
ino=$(stat -c %i "$MNT/f")
tfs_umount || fail "unmount"

obj=$(find "$OBJDIR" -name '*._S3rver_object' -size +1M | sort | head -n 1)
[ -n "$obj" ] || fail "no object of the tier in $OBJDIR"
flip_byte "$obj" $((3 * MB + 777)) || fail "cannot damage $obj"

tfs_mount "$OPTS"
readcheck f >"$T/eio"
[ "$(wc -l <"$T/eio")" -eq 1 ] || fail "blocks that read EIO: $(tr '\n' ' ' <"$T/eio"), want one"
blk=$(awk '{ print $2 }' "$T/eio")
grep -q "checksum mismatch: inode $ino block $blk, read from s3 slot " "$LOG" ||
	fail "no log line names inode $ino block $blk"
[ "$(tfs_stat_json tiers s3 checksum_errors)" -ge 1 ] || fail "the s3 tier counts no checksum error"
rc=0
"$TFSCTL" -m "$MNT" scrub >"$T/scrub.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat "$T/scrub.txt" >&2; fail "scrub exited $rc with a damaged block, want 1"; }
grep -q "^/f block $blk: checksum mismatch (s3 slot [0-9]*)$" "$T/scrub.txt" ||
	{ cat "$T/scrub.txt" >&2; fail "scrub does not list /f block $blk"; }
grep -q '^scrub: 16 blocks checked (0 without a hash) in .* 1 damaged$' "$T/scrub.txt" ||
	{ cat "$T/scrub.txt" >&2; fail "scrub's summary"; }
tfs_umount || fail "unmount"
echo "PASS: s3 checksum"
