#!/bin/bash
# Packed objects that are partly dead are compacted, and the bytes stay
# right. An s3-only tier with 8 blocks per object:
#   1. 32 MiB written and fsynced: 4 objects, nothing dead;
#   2. five blocks of each object rewritten and fsynced: the old copies die
#      (dead_bytes), and each object, five eighths dead, is compacted in the
#      background into a version with its three live blocks; the old
#      versions are deleted: no dead bytes, and the bucket holds exactly the
#      objects the tier stores;
#   3. the file, evicted from DRAM, reads back from the compacted objects
#      byte for byte, and again after a remount (which lists the bucket and
#      finds nothing to delete);
#   4. the file removed: every object is deleted from the bucket;
#   5. a file four times the DRAM tier, written with no fsync, so that
#      eviction drives write-back: the objects go out whole, at most 26 for
#      its 128 blocks (16 whole; where the flusher was late, a batch's end
#      may cut one object). (Regression: the clean reserve was 2 of
#      the 64 slots, the flusher's batches that small, and objects went out
#      with a few of their 8 blocks: 42 objects, and as many PUTs, for these
#      128 blocks.)

. "$(dirname "$0")/lib_s3.sh"

export TFS_DRAM=64M TFS_THREADS=8
s3_start
NVME=none
mkdir -p "$META"
OPTS="$(s3_mount_opts compact),s3_object=8M"
OBJDIR="$S3_DATA/$S3_BUCKET/compact"

stat_s3() {
	tfs_stat_json tiers s3 "$1"
}

bucket_objects() {
	find "$OBJDIR" -path '*/pk/*' -name '*._S3rver_object' | wc -l
}

# What a settle that timed out says (lib_s3.sh).
SETTLE_DETAIL='echo "objects $(stat_s3 objects), in the bucket $(bucket_objects), dead $(stat_s3 dead_bytes) bytes, compacted $(stat_s3 compacted_objects)"'

tfs_mount "$OPTS"
head -c 32M /dev/urandom >"$T/model"
dd if="$T/model" of="$MNT/f" bs=1M conv=fsync status=none || fail "write f"
settle "32 MiB did not become 4 whole objects" \
	'[ "$(stat_s3 objects)" -eq 4 ] && [ "$(bucket_objects)" -eq 4 ]'
[ "$(stat_s3 dead_bytes)" -eq 0 ] || fail "dead bytes after writing a new file"

for g in 0 1 2 3; do
	head -c 5M /dev/urandom >"$T/new"
	dd if="$T/new" of="$T/model" bs=1M seek=$((g * 8)) conv=notrunc status=none
	dd if="$T/new" of="$MNT/f" bs=1M seek=$((g * 8)) conv=notrunc,fsync status=none ||
		fail "rewrite of group $g"
done
settle "the four objects, 5/8 dead, were not compacted" \
	'[ "$(stat_s3 compacted_objects)" -ge 4 ] && [ "$(stat_s3 dead_bytes)" -eq 0 ]'
settle "the bucket holds other objects than the tier stores" \
	'[ "$(bucket_objects)" -eq "$(stat_s3 objects)" ]'
echo "   compacted $(stat_s3 compacted_objects) objects, rewriting" \
	"$(($(stat_s3 compacted_bytes) >> 20)) MiB; $(stat_s3 objects) objects stored"
[ "$(stat_s3 compacted_bytes)" -eq $((4 * 3 << 20)) ] ||
	fail "compaction rewrote $(stat_s3 compacted_bytes) bytes, not the 12 MiB still live"

echo "evict /f" >"$MNT/.tensorfs/ctl" || fail "evict /f failed"
READ0=$(stat_s3 read_bytes)
cmp "$T/model" "$MNT/f" || fail "f differs after compaction"
[ "$(stat_s3 read_bytes)" -gt "$READ0" ] || fail "f was not read back from s3"

tfs_umount || fail "tensorfs exited $? after unmount"
tfs_mount "$OPTS"
grep -q "s3: [0-9]* objects of this tier in the bucket, 0 of them to delete" "$LOG" ||
	fail "the mount found objects to delete after a clean unmount"
cmp "$T/model" "$MNT/f" || fail "f differs after a remount"

rm "$MNT/f"
settle "the objects of a removed file were not deleted" \
	'[ "$(stat_s3 objects)" -eq 0 ] && [ "$(bucket_objects)" -eq 0 ]'

head -c 128M /dev/urandom >"$T/big"
dd if="$T/big" of="$MNT/big" bs=1M status=none || fail "write big"
sync "$MNT/big" || fail "fsync big"
n=$(stat_s3 objects)
echo "   128 MiB over dram=64M, written back under eviction: $n objects (16 whole)"
[ "$n" -le 26 ] || fail "128 blocks went out in $n objects, not about 16 whole ones"
cmp "$T/big" "$MNT/big" || fail "big differs"
tfs_umount || fail "tensorfs exited $? after unmount"
s3_secret_leaks "$LOG"

echo "PASS: half-dead objects compacted, bytes intact, dead objects deleted"
exit 0
