#!/bin/bash
# scratch=on: the store outlives its daemon, not its machine.
#
# 1. Its sync points flush no drive, counted where the kernel counts them:
#    the flush requests of the loop device under the store
#    (/proc/diskstats), through the same rewrites with scratch=off (at
#    least one flush per sync point) and scratch=on (few: the journal's
#    own). Its clean unmount does flush (scratch=off's has nothing left to).
# 2. A kill -9 loses nothing that was flushed (tfsctl flush) before it: the
#    machine kept its page cache.
# 3. After a power cut (the lock file names another boot, as a restart
#    leaves it) the store opens empty, says so, and works: its nvme folder
#    is still its own, a new file reads back across a remount, fsck is
#    clean. A store mounted without scratch=on after that runs as any
#    other: after its own kill and restart it rolls back, it is not emptied.
# 4. A mount without scratch=on after a scratch daemon was killed on this
#    boot keeps the files, and the mark goes.
# 5. A clean unmount with scratch=on, then a restart: the files are there.

. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib_fullfs.sh"

: "${TFSCTL:?TFSCTL must name tfsctl}"
OTHER_BOOT=00000000-0000-0000-0000-000000000000
export TFS_DRAM=64M TFS_THREADS=8

small_fs "$T/disk" 768
NVME="$T/disk/nvme"
META="$T/disk/meta"
mkdir -p "$NVME"
SRC="$T/src"
mkdir -p "$SRC"
for i in 1 2 3 4 5 6; do
	head -c $((3 << 20)) /dev/urandom >"$SRC/f$i"
done

# set_boot ID: the lock file as an unclean stop under boot ID leaves it.
set_boot() {
	local pid store
	pid=$(sed -n 1p "$META/lock")
	store=$(sed -n 3p "$META/lock")
	[ -n "$pid" ] || fail "set_boot: the lock file says the last stop was clean"
	printf '%s\n%s\n%s\n' "$pid" "$1" "$store" >"$META/lock"
}

# same DIR: the files of $SRC are in DIR with their bytes.
same() {
	local f
	for f in "$SRC"/*; do
		cmp -s "$f" "$1/$(basename "$f")" || return 1
	done
}

fsck_clean() {
	"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || {
		cat "$T/fsck.out" >&2
		fail "$1: fsck"
	}
}

flushes() {
	awk -v d="$(basename "$DISK_DEV")" '$3 == d { print $19 }' /proc/diskstats
}

# churn: rewrite 96 MiB in 4 MiB files 8 times over dram=64M, each pass
# made to stay (fsync, so it is written back and committed).
churn() {
	local pass i
	for pass in 1 2 3 4 5 6 7 8; do
		for i in $(seq 1 24); do
			dd if=/dev/urandom of="$MNT/c$i" bs=1M count=4 conv=fsync status=none ||
				fail "rewrite of c$i"
		done
	done
	rm -f "$MNT"/c*
}

echo "1. flushes at sync points, counted by the kernel"
DISK_DEV=""
[ "$SMALL_KIND" = ext4 ] && DISK_DEV=$(findmnt -n -o SOURCE "$T/disk")
if [ -n "$DISK_DEV" ] && [ -n "$(flushes)" ]; then
	for mode in off on; do
		tfs_mount "scratch=$mode,sync_interval_ms=20"
		sleep 0.5
		s0=$(tfs_stat_json cache syncs)
		f0=$(flushes)
		churn
		s1=$(tfs_stat_json cache syncs)
		f1=$(flushes)
		tfs_umount || fail "scratch=$mode: tensorfs exited $? after unmount"
		f2=$(flushes)
		syncs=$((s1 - s0))
		fl=$((f1 - f0))
		echo "   scratch=$mode: $syncs sync points, $fl flushes of $DISK_DEV, $((f2 - f1)) at the unmount"
		[ "$syncs" -ge 40 ] || fail "scratch=$mode: only $syncs sync points in the churn"
		if [ "$mode" = off ]; then
			[ "$fl" -ge "$syncs" ] || fail "scratch=off: $fl flushes for $syncs sync points"
		else
			[ $((fl * 4)) -lt "$syncs" ] ||
				fail "scratch=on: $fl flushes for $syncs sync points"
		fi
		[ "$mode" = off ] || [ $((f2 - f1)) -ge 1 ] || fail "scratch=on: the unmount flushed nothing"
	done
else
	echo "   (no loop device under the store: not counted)"
fi

echo "2. a kill -9 loses nothing flushed"
tfs_mount "scratch=on"
"$TFSCTL" -m "$MNT" config --json 2>/dev/null | grep -q '"scratch": *true' ||
	fail "tfsctl config does not say scratch"
[ -f "$META/scratch" ] || fail "no scratch mark in the meta folder"
cp "$SRC"/* "$MNT/" || fail "copy"
"$TFSCTL" -m "$MNT" flush >/dev/null || fail "tfsctl flush"
tfs_kill9
tfs_mount "scratch=on"
same "$MNT" || fail "the files changed across a kill -9"
grep -q "starts empty" "$LOG" && fail "the store was emptied after a kill on this boot"
echo "   the files are whole"

echo "3. a power cut empties the store"
tfs_kill9
set_boot "$OTHER_BOOT"
: >"$LOG"
tfs_mount "scratch=on"
grep -q "scratch=on and the machine stopped under it.*starts empty" "$LOG" ||
	fail "the mount did not say that it emptied the store"
n=$(find "$MNT" -mindepth 1 -not -path "$MNT/.tensorfs*" | wc -l)
[ "$n" -eq 0 ] || fail "$n entries left in the emptied store"
head -c $((5 << 20)) /dev/urandom >"$T/new"
cp "$T/new" "$MNT/new" || fail "write to the emptied store"
tfs_umount || fail "tensorfs exited $? after unmount of the emptied store"
fsck_clean "emptied store"
tfs_mount ""
cmp -s "$T/new" "$MNT/new" || fail "the new file changed across a remount"
[ ! -e "$META/scratch" ] || fail "a mount without scratch=on left the mark"
"$TFSCTL" -m "$MNT" flush >/dev/null || fail "tfsctl flush"
tfs_kill9
set_boot "$OTHER_BOOT"
: >"$LOG"
tfs_mount ""
grep -q "starts empty" "$LOG" && fail "a store mounted without scratch=on was emptied"
cmp -s "$T/new" "$MNT/new" || fail "the flushed file is not there after a power cut"
rm "$MNT/new"
echo "   emptied, then works; a mount without scratch=on is not emptied"

echo "4. a mount without scratch=on after a scratch daemon's kill"
tfs_umount || fail "unmount"
tfs_mount "scratch=on"
cp "$SRC"/* "$MNT/" || fail "copy"
"$TFSCTL" -m "$MNT" flush >/dev/null || fail "tfsctl flush"
tfs_kill9
tfs_mount ""
same "$MNT" || fail "the files changed across a kill -9 and a mount without scratch=on"
[ ! -e "$META/scratch" ] || fail "the mark is still there"
echo "   the files are whole, the mark gone"

echo "5. a clean unmount with scratch=on, then a restart"
tfs_umount || fail "unmount"
tfs_mount "scratch=on"
tfs_umount || fail "tensorfs exited $? after the unmount"
[ ! -s "$META/lock" ] || fail "the clean unmount left the lock file saying unclean"
tfs_mount "scratch=on"
same "$MNT" || fail "the files changed across a clean unmount"
tfs_umount || fail "unmount"
fsck_clean "after a clean unmount"
echo "   the files are whole"
echo "PASS"
