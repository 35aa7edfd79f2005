#!/bin/bash
# scratch=on with an s3 tier (s3 alone, 8 blocks per object): after a power
# cut the mount empties the store, and the objects its files lived in are
# deleted from the bucket, none leaked; the emptied store then stores and
# reads back a new file across a remount, in objects of its own.
#   1. 32 MiB written and flushed (tfsctl flush): 4 objects in the bucket;
#   2. a kill -9, and the lock file names another boot, as a restart
#      leaves it: the mount says it empties the store, no file is left, and
#      the bucket's objects are all deleted (the sweep at mount);
#   3. a new file written, a clean unmount, a mount: it reads back, and the
#      bucket holds exactly the objects the tier stores.

. "$(dirname "$0")/lib_s3.sh"

: "${TFSCTL:?TFSCTL must name tfsctl}"
export TFS_DRAM=64M TFS_THREADS=8
s3_start
NVME=none
mkdir -p "$META"
OPTS="$(s3_mount_opts scratch),s3_object=8M,scratch=on"
OBJDIR="$S3_DATA/$S3_BUCKET/scratch"

stat_s3() {
	tfs_stat_json tiers s3 "$1"
}

bucket_objects() {
	find "$OBJDIR" -path '*/pk/*' -name '*._S3rver_object' 2>/dev/null | wc -l
}

# What a settle that timed out says (lib_s3.sh).
SETTLE_DETAIL='echo "in the bucket $(bucket_objects)"'

echo "1. 32 MiB flushed to s3"
tfs_mount "$OPTS"
head -c 32M /dev/urandom >"$T/old"
cp "$T/old" "$MNT/old" || fail "write old"
"$TFSCTL" -m "$MNT" flush >/dev/null || fail "tfsctl flush"
settle "32 MiB did not become 4 objects in the bucket" '[ "$(bucket_objects)" -eq 4 ]'

echo "2. a power cut: the store empties, the bucket too"
tfs_kill9
pid=$(sed -n 1p "$META/lock")
store=$(sed -n 3p "$META/lock")
[ -n "$pid" ] && [ -n "$store" ] || fail "the lock file does not show the kill"
printf '%s\n%s\n%s\n' "$pid" 00000000-0000-0000-0000-000000000000 "$store" >"$META/lock"
: >"$LOG"
tfs_mount "$OPTS"
grep -q "scratch=on and the machine stopped under it.*starts empty" "$LOG" ||
	fail "the mount did not say that it emptied the store"
[ ! -e "$MNT/old" ] || fail "the emptied store still holds the old file"
grep -q "s3: 4 objects of this tier in the bucket, 4 of them to delete" "$LOG" ||
	fail "the sweep at mount did not find the 4 objects to delete"
settle "the old objects were not deleted" '[ "$(bucket_objects)" -eq 0 ]'
echo "   emptied; 4 objects deleted"

echo "3. the emptied store works"
head -c 20M /dev/urandom >"$T/new"
cp "$T/new" "$MNT/new" || fail "write new"
tfs_umount || fail "tensorfs exited $? after unmount"
tfs_mount "$OPTS"
cmp "$T/new" "$MNT/new" || fail "new differs after a remount"
settle "the bucket holds other objects than the tier stores" \
	'[ "$(bucket_objects)" -eq "$(stat_s3 objects)" ]'
[ "$(stat_s3 objects)" -ge 3 ] || fail "20 MiB stored in $(stat_s3 objects) objects"
tfs_umount || fail "tensorfs exited $? after unmount"
s3_secret_leaks "$LOG"
echo "PASS"
