#!/bin/bash
# Mount test: a disk that another process fills after the mount. A writer
# must end, with ENOSPC, within BOUND seconds; none may sit in D state;
# what was accepted is written back once space returns. (Regression: the
# writer sat at the dirty mark, unkillable, until the disk was freed, 14
# minutes in one report; df said 249M free when the disk had 53M; a full
# metadata filesystem read as EIO; tfsctl flush blamed pins.)
#
# The nvme folder is on a 300 MiB filesystem (ext4 in a loop image, else
# a tmpfs), dram=128M: the DRAM tier alone takes most of a write.
#   1. meta inside the nvme folder. Another process fills the filesystem
#      to 50 MiB free: df on the mount must say no more than that. dd of
#      200 MiB must end within BOUND s with ENOSPC, and stats show nvme0
#      full. The filler takes the rest, so that what dd left in DRAM
#      cannot go: health says write-back fails, and tfsctl flush fails
#      within BOUND s naming the lack of space, not pins. The fillers go:
#      nvme0 has room again, tfsctl flush succeeds, and every byte dd wrote
#      reads back after a remount; fsck is clean.
#   2. The same with meta= on another filesystem.
#   3. meta= on its own small filesystem, which another process fills:
#      commits fail with ENOSPC (or, as LMDB reuses its pages, some pass)
#      while the nvme folder has room, and writers wait at the dirty mark.
#      dd of 300 MiB must end within BOUND s, with ENOSPC or success.
#      Freed: flush succeeds, and the data reads back.
#   4. As 3, with stall_wait_ms=600000 and a longer dd: once the writer
#      waits at the dirty mark, SIGKILL must end it within 10 s (the
#      request is interrupted).

. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib_fullfs.sh"

command -v python3 >/dev/null 2>&1 || skip "python3 not found"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

BOUND=30 # seconds a writer may take to end once the disk is full
MiB=$((1 << 20))
export TFS_DRAM=128M

SRC="$T/src"
head -c $((300 * MiB)) /dev/urandom >"$SRC" || fail "cannot make the source bytes"

# write_until_full NAME MIB [ok]: dd MIB MiB of $SRC to $MNT/NAME in the
# background; it must end within BOUND s, with ENOSPC (or success, given
# ok). Its stderr is in $T/dd.err.
write_until_full() {
	local rc=0 st
	run_bg dd if="$SRC" of="$MNT/$1" bs=1M count="$2" conv=notrunc 2>"$T/dd.err"
	waitfor "$BG" "$BOUND" || rc=$?
	if [ $rc -eq 124 ]; then
		st=$(pstate "$BG")
		tfs_stacks
		fail "dd to a full disk still runs after $BOUND s (state $st, wchan $(cat /proc/"$BG"/wchan 2>/dev/null))"
	fi
	if [ $rc -eq 0 ] && [ "${3:-}" = ok ]; then
		echo "   dd of $2 MiB succeeded"
		return 0
	fi
	[ $rc -ne 0 ] || fail "dd of $2 MiB to a full disk succeeded"
	grep -q "No space left on device" "$T/dd.err" || fail "dd failed, but not with ENOSPC: $(cat "$T/dd.err")"
	echo "   dd ended with ENOSPC after $(($(stat -c %s "$MNT/$1") / MiB)) MiB"
}

# nvme_state STATE: nvme0's state in the stats becomes STATE within 10 s.
nvme_state() {
	local i s
	for i in $(seq 1 100); do
		s=$(tfs_stat_json tiers nvme0 state) || fail "stats unreadable"
		[ "$s" = "$1" ] && return 0
		sleep 0.1
	done
	fail "nvme0 is $s, want $1 (stats: $(cat "$MNT/.tensorfs/stats"))"
}

# flush_ok: tfsctl flush succeeds within BOUND s.
flush_ok() {
	within "$BOUND" "$TFSCTL" -m "$MNT" flush >"$T/flush.out" 2>&1 ||
		fail "tfsctl flush after space came back: $(cat "$T/flush.out")"
}

# readback NAME: after a clean unmount, fsck and a remount, NAME holds the
# first bytes of $SRC, as many as its size.
readback() {
	local size
	size=$(stat -c %s "$MNT/$1") || fail "stat $1"
	tfs_umount || fail "tensorfs exited with an error at unmount"
	"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
	tail -n 1 "$T/fsck.out" | grep -qx 'fsck: clean' || fail "fsck: $(cat "$T/fsck.out")"
	tfs_mount
	[ "$(stat -c %s "$MNT/$1")" = "$size" ] || fail "$1 is $(stat -c %s "$MNT/$1") bytes after remount, was $size"
	cmp -n "$size" "$SRC" "$MNT/$1" || fail "$1 does not read back what dd wrote"
	tfs_umount || fail "tensorfs exited with an error at unmount"
}

# part_nvme_full N META: parts 1 and 2.
part_nvme_full() {
	local disk="$T/disk$1" avail mnt_avail
	small_fs "$disk" 300
	NVME="$disk/nvme"
	mkdir -m 700 "$NVME"
	META=$2
	tfs_mount
	avail=$(fs_avail "$disk")
	dd if=/dev/zero of="$disk/filler" bs=1M count=$(((avail - 50 * MiB) / MiB)) status=none ||
		fail "cannot fill $disk"
	sync -f "$disk/filler"
	avail=$(fs_avail "$disk")
	mnt_avail=$(fs_avail "$MNT")
	[ "$mnt_avail" -le "$avail" ] ||
		fail "df on the mount says $((mnt_avail / MiB)) MiB free; its disk has $((avail / MiB)) MiB"
	write_until_full f 200
	nvme_state full
	"$TFSCTL" -m "$MNT" stats >"$T/stats.out" 2>&1 || fail "tfsctl stats: $(cat "$T/stats.out")"
	grep -q "^health .*nvme0 full" "$T/stats.out" || fail "tfsctl stats does not say nvme0 is full: $(cat "$T/stats.out")"
	# What dd left in DRAM cannot go now: flush says why.
	fill "$disk" filler2
	within "$BOUND" "$TFSCTL" -m "$MNT" flush >"$T/flush.out" 2>&1 && fail "tfsctl flush succeeded on a full disk"
	grep -q "no space left on the devices" "$T/flush.out" || fail "tfsctl flush on a full disk says: $(cat "$T/flush.out")"
	grep -q "pinned" "$T/flush.out" && fail "tfsctl flush on a full disk blames pins: $(cat "$T/flush.out")"
	health=$(tfs_stat_json health) || fail "stats unreadable"
	case "$health" in
	*"nvme0 full"*"write-back failing"*"No space left on device"*) ;;
	*) fail "health on a full disk: $health" ;;
	esac
	rm -f "$disk/filler" "$disk/filler2"
	nvme_state up
	flush_ok
	readback f
}

echo "1. meta inside the nvme folder, on a disk another process fills"
part_nvme_full 1 "$T/disk1/nvme/meta"
echo "2. meta= on another filesystem"
part_nvme_full 2 "$T/meta2"

echo "3. meta= on a small filesystem that another process fills"
small_fs "$T/metafs" 16
NVME="$T/nvme3"
META="$T/metafs/meta"
mkdir -m 700 "$NVME"
tfs_mount
touch "$MNT/f" || fail "touch"
sync -f "$MNT/f"
fill "$T/metafs" filler
write_until_full f 300 ok
echo "   health: $(tfs_stat_json health)"
rm -f "$T/metafs/filler"
flush_ok
[ "$(tfs_stat_json cache dirty_bytes)" = 0 ] || fail "dirty data left after flush"
readback f

echo "4. the writer waits at the dirty mark: SIGKILL ends it"
tfs_mount stall_wait_ms=600000
touch "$MNT/g" || fail "touch"
sync -f "$MNT/g"
fill "$T/metafs" filler
waits=$(tfs_stat_json cache backpressure_waits)
run_bg dd if=/dev/urandom of="$MNT/g" bs=1M count=4000 conv=notrunc status=none
for i in $(seq 1 300); do
	[ "$(tfs_stat_json cache backpressure_waits)" -gt "$waits" ] && break
	sleep 0.1
done
[ "$(pstate "$BG")" != gone ] || fail "dd ended before it waited at the dirty mark"
sleep 1
kill -9 "$BG"
waitfor "$BG" 10 >/dev/null 2>&1
if alive "$BG"; then
	fail "dd waiting at the dirty mark outlives SIGKILL by 10 s (state $(pstate "$BG"))"
fi
rm -f "$T/metafs/filler"
flush_ok
tfs_umount || fail "tensorfs exited with an error at unmount"
"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
echo "PASS: writers to a disk filled by another process end with ENOSPC ($SMALL_KIND)"
exit 0
