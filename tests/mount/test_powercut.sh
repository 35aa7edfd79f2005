#!/bin/bash
# A power cut, made on the metadata store's files.
#
# LMDB commits without a flush (MDB_NOSYNC), and each sync point records
# its durable state in <meta>/durable (fs/meta.c). After a power cut the
# disk may hold:
#   A. the newest meta page, but not the pages it names: a flush writes a
#      file's dirty pages in any order, and LMDB's meta pages are its first;
#   B. every page, but the meta pages of the last sync point.
# Each image is made from copies of data.mdb and durable taken right after
# a sync point (tfsctl flush), and of the store's files after more work and
# a kill -9: the files rewritten, a large file written through the cache,
# hundreds of files made, renamed and unlinked. No sync point comes between
# (sync_interval_ms=600000, sync_commits= above the commits made, no
# fsync), so the slab still holds what the
# sync point names. The lock file's boot id is changed, as a restart
# would change it. Each mount must then show the store as it was at the
# sync point: the files flushed before it with their old bytes, the files
# made after it absent, and fsck clean. A roll-back that cannot write
# refuses the mount and leaves the lock file for the next one.
#
# Without the record, A opens a tree whose pages are not there; without a
# reader pinned on the sync point's commit, later commits reuse its pages
# and B opens a tree written over. Last, a kill -9 with the boot id
# unchanged (no restart: the page cache kept every page) must keep what was
# committed after the sync point: a folder made. And a record that names a
# commit newer than any of the store's (a durable file from another copy of
# the store) is refused: the store opens as its own pages say.

. "$(dirname "$0")/lib.sh"
tfs_extra_cleanup() { :; }

: "${TFSCTL:?TFSCTL must name tfsctl}"
PS=$(getconf PAGESIZE)
OTHER_BOOT=00000000-0000-0000-0000-000000000000
SRC="$T/src"
mkdir -p "$SRC"
export TFS_DRAM=128M TFS_THREADS=8
OPTS="sync_interval_ms=600000,sync_commits=100000000"

# sums DIR: the sha256 of every file of set A under DIR, one line each.
sums() {
	(cd "$1" && sha256sum a/* | sort -k2)
}

# set_boot ID: the lock file as an unclean stop under boot ID leaves it.
set_boot() {
	printf '%s\n%s\n' 999999 "$1" >"$META/lock"
}

# page_over DEST SRC: LMDB's two meta pages of SRC written over DEST's.
page_over() {
	dd if="$2" of="$1" bs="$PS" count=2 conv=notrunc status=none || fail "dd of the meta pages"
}

# check_rolled_back NAME: mount, the store as it was at the sync point.
check_rolled_back() {
	local name=$1 n
	: >"$LOG"
	tfs_mount "$OPTS"
	grep -q "rolled back to its last durable point" "$LOG" ||
		fail "$name: the mount did not say it rolled the store back"
	[ "$(sums "$MNT")" = "$(sums "$SRC")" ] || fail "$name: set A is not as it was at the sync point"
	n=$(find "$MNT/b" -type f 2>/dev/null | wc -l)
	[ "$n" -eq 0 ] || fail "$name: $n files made after the sync point are there"
	[ ! -e "$MNT/big" ] || fail "$name: the file written after the sync point is there"
	tfs_umount || fail "$name: tensorfs exited $? after unmount"
	"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || {
		cat "$T/fsck.out" >&2
		fail "$name: fsck after the roll-back"
	}
	echo "   $name: rolled back, set A whole, fsck clean"
}

# Set A: 24 files of 2 MiB, and a sync point.
mkdir -p "$SRC/a"
for i in $(seq 1 24); do
	head -c $((2 << 20)) /dev/urandom >"$SRC/a/f$i"
done
tfs_mount "$OPTS"
cp -r "$SRC/a" "$MNT/a" || fail "copy of set A"
"$TFSCTL" -m "$MNT" flush >/dev/null || fail "tfsctl flush"
for try in 1 2 3 4 5; do
	syncs=$(tfs_stat_json cache syncs)
	cp "$META/data.mdb" "$T/snap.mdb" && cp "$META/durable" "$T/snap.durable" ||
		fail "copy of the store's files"
	[ "$(tfs_stat_json cache syncs)" = "$syncs" ] && break
	[ "$try" -lt 5 ] || fail "a sync point came during every copy"
done
[ -s "$T/snap.durable" ] || fail "the flush recorded no durable point"

# After it: set A rewritten, a file larger than the DRAM tier (set A's new
# blocks are written back and committed), 200 files made, each renamed
# twice, 150 unlinked (fewer than the frees that call a sync point).
for i in $(seq 1 24); do
	head -c $((2 << 20)) /dev/urandom >"$MNT/a/f$i" || fail "rewrite of a/f$i"
done
dd if=/dev/urandom of="$MNT/big" bs=1M count=300 status=none || fail "write of big"
mkdir -p "$MNT/b"
for i in $(seq 1 200); do
	head -c 8192 /dev/urandom >"$MNT/b/g$i" || fail "write of b/g$i"
done
for i in $(seq 1 200); do
	mv "$MNT/b/g$i" "$MNT/b/h$i" && mv "$MNT/b/h$i" "$MNT/b/k$i" || fail "rename of b/g$i"
done
for i in $(seq 1 150); do
	rm "$MNT/b/k$i" || fail "unlink of b/k$i"
done
[ "$(tfs_stat_json cache syncs)" = "$syncs" ] || fail "a sync point came after the snapshot"
wb=$(tfs_stat_json cache writeback_bytes)
[ "$wb" -gt $((100 << 20)) ] || fail "only $wb bytes were written back after the sync point"
tfs_kill9
[ -n "$(head -n1 "$META/lock")" ] || fail "the lock file does not show the kill"
[ "$(sed -n 2p "$META/lock")" = "$(cat /proc/sys/kernel/random/boot_id)" ] ||
	fail "the lock file does not name this boot"
cp "$META/data.mdb" "$T/cur.mdb" || fail "copy of data.mdb"
cp --sparse=always "$NVME/tensorfs.slab" "$T/cur.slab" || fail "copy of the slab"
cmp -s <(head -c $((2 * PS)) "$T/snap.mdb") <(head -c $((2 * PS)) "$T/cur.mdb") &&
	fail "no commit came after the sync point"

echo "A: the newest meta page over the sync point's pages"
cp "$T/snap.mdb" "$META/data.mdb" && page_over "$META/data.mdb" "$T/cur.mdb"
cp "$T/snap.durable" "$META/durable"
set_boot "$OTHER_BOOT"
# A roll-back that fails refuses the mount and leaves the lock file as it
# was, so that the next mount rolls back: data.mdb immutable (chattr +i,
# where the filesystem has it) cannot be opened for writing, even by root.
if chattr +i "$META/data.mdb" 2>/dev/null; then
	: >"$LOG"
	"$TENSORFS" -f -o "nvme=$NVME,meta=$META,dram=$TFS_DRAM,threads=$TFS_THREADS,$OPTS" \
		"$MNT" >>"$LOG" 2>&1 && rc=0 || rc=$?
	chattr -i "$META/data.mdb"
	is_mounted "$MNT" && fail "A: mounted though the roll-back could not write data.mdb"
	[ "$rc" -ne 0 ] || fail "A: the refused mount exited 0"
	grep -q "cannot roll the store back\|cannot roll back to its last durable point" "$LOG" || fail "A: no message for the failed roll-back"
	[ "$(sed -n 2p "$META/lock")" = "$OTHER_BOOT" ] ||
		fail "A: the failed roll-back left the lock file saying this boot"
	echo "   A: a roll-back that cannot write is refused, and left for the next mount"
fi
check_rolled_back A

echo "B: every page, with the sync point's meta pages"
cp "$T/cur.mdb" "$META/data.mdb" && page_over "$META/data.mdb" "$T/snap.mdb"
cp "$T/snap.durable" "$META/durable"
cp --sparse=always "$T/cur.slab" "$NVME/tensorfs.slab"
set_boot "$OTHER_BOOT"
check_rolled_back B

echo "kill -9 on the same boot: no roll-back"
tfs_mount "$OPTS"
mkdir "$MNT/after" || fail "mkdir of after"
tfs_kill9
: >"$LOG"
tfs_mount "$OPTS"
grep -q "rolled back" "$LOG" && fail "a kill -9 on the same boot rolled the store back"
[ -d "$MNT/after" ] || fail "a folder made after the sync point is gone after a kill -9"
tfs_umount || fail "tensorfs exited $? after unmount"
cp "$META/durable" "$T/late.durable"

echo "a record newer than the store (another copy's): no roll-back"
cp "$T/snap.mdb" "$META/data.mdb"
cp --sparse=always "$T/cur.slab" "$NVME/tensorfs.slab"
cp "$T/late.durable" "$META/durable"
set_boot "$OTHER_BOOT"
: >"$LOG"
tfs_mount "$OPTS"
grep -q "does not belong to this store" "$LOG" || fail "a foreign record was not refused"
grep -q "rolled back" "$LOG" && fail "the store was rolled back to a foreign record"
[ "$(sums "$MNT")" = "$(sums "$SRC")" ] || fail "set A is not as the store's own pages hold it"
tfs_umount || fail "tensorfs exited $? after unmount"
echo "PASS"
