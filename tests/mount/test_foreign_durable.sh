#!/bin/bash
# A durable record of another store is not applied (issue 37, case 9).
#
# After an unclean stop on an earlier boot, the store rolls back to the
# meta page that its durable file records (fs/meta.c, test_powercut.sh). A
# durable file of another store, copied or restored into the meta folder,
# with a lower commit number, used to be written over both of LMDB's meta
# pages: the store could no longer be opened. Each record now names its
# store, and the lock file the store its daemon had open: a record of
# another store is refused, and data.mdb is left untouched.
#
# Store X is made and stopped. Store Y gets 200 files and an 8 MiB one,
# fsynced, and its daemon is killed (the lock file then shows an unclean
# stop, with its pid, boot id and store id); its boot id is then changed,
# as a restart would change it, and X's durable file is put in Y's meta
# folder. tfsctl fsck and then a mount of Y must find Y whole: data.mdb as
# it was until the mount's own commits, every file there, the 8 MiB file
# as written, and the log saying the record was not applied.

. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name tfsctl}"

OTHER_BOOT=00000000-0000-0000-0000-000000000000
export TFS_DRAM=128M TFS_THREADS=4
MB=$((1 << 20))

# Store X: a few commits.
mkdir -p "$T/x-nvme"
NVME="$T/x-nvme" META="$T/x-meta" tfs_mount
echo x >"$MNT/x"
tfs_umount || fail "X: unmount"

# Store Y: many more commits, then a kill -9.
mkdir -p "$T/y-nvme"
NVME="$T/y-nvme" META="$T/y-meta" tfs_mount
for i in $(seq 1 200); do
	echo "$i" >"$MNT/f$i"
done
head -c $((8 * MB)) /dev/urandom >"$T/big.ref"
cp "$T/big.ref" "$MNT/big" && sync "$MNT/big" || fail "Y: cannot write big"
tfs_kill9
Y_ID=$(sed -n 's/.* store=\([^ ]*\) .*/\1/p' "$T/y-nvme/tensorfs.dev")
[ -n "$Y_ID" ] || fail "Y: no store id in its tensorfs.dev"
# The lock file as the kill left it, after a restart (another boot id).
sed "2s/.*/$OTHER_BOOT/" "$T/y-meta/lock" >"$T/lock.restart"

# unclean_with_x: the restart, and X's durable file in Y's folder.
unclean_with_x() {
	cp "$T/lock.restart" "$T/y-meta/lock"
	cp "$T/x-meta/durable" "$T/y-meta/durable"
}
unclean_with_x
cp "$T/y-meta/data.mdb" "$T/y-data.before"

rc=0
"$TFSCTL" fsck "$T/y-meta" >"$T/fsck.out" 2>&1 || rc=$?
[ $rc -lt 128 ] || fail "fsck died by signal $((rc - 128))"
cmp -s "$T/y-meta/data.mdb" "$T/y-data.before" ||
	fail "fsck applied X's durable record to Y: data.mdb changed (fsck exit $rc: $(cat "$T/fsck.out"))"
grep -q "holds no record of this store ($Y_ID), only 2 of another store" "$T/fsck.out" ||
	fail "fsck does not say that the record is another store's: $(cat "$T/fsck.out")"
grep -q "202 inodes (201 files" "$T/fsck.out" || fail "fsck does not find Y's files: $(cat "$T/fsck.out")"
[ $rc -eq 0 ] || fail "fsck of Y: exit $rc: $(cat "$T/fsck.out")"
[ "$(sed -n 3p "$T/lock.restart")" = "$Y_ID" ] ||
	fail "Y: the lock file of the killed daemon does not name its store: $(cat "$T/lock.restart")"

# The same through a mount.
unclean_with_x
: >"$LOG"
NVME="$T/y-nvme" META="$T/y-meta" tfs_mount
grep -q "holds no record of this store ($Y_ID)" "$LOG" ||
	fail "the mount does not say that the record is another store's"
grep -q "rolled back" "$LOG" && fail "the mount rolled Y back to X's record"
[ "$(ls "$MNT" | wc -l)" -eq 201 ] || fail "Y holds $(ls "$MNT" | wc -l) files, not 201"
cmp -s "$T/big.ref" "$MNT/big" || fail "Y's big does not read back as written"
[ "$(cat "$MNT/f77")" = 77 ] || fail "Y's f77 reads '$(cat "$MNT/f77")'"
tfs_umount || fail "Y: unmount"

# A record of Y's own is still applied after such a stop: Y's durable file
# as the last stop left it, and the lock file showing a restart.
NVME="$T/y-nvme" META="$T/y-meta" tfs_mount
mkdir "$MNT/after"
tfs_kill9
sed -i "2s/.*/$OTHER_BOOT/" "$T/y-meta/lock"
: >"$LOG"
NVME="$T/y-nvme" META="$T/y-meta" tfs_mount
grep -q "rolled back to its last durable point" "$LOG" || fail "Y's own record was not applied: $(cat "$LOG")"
cmp -s "$T/big.ref" "$MNT/big" || fail "Y's big after its own roll-back"
tfs_umount || fail "Y: last unmount"
echo PASS
exit 0
