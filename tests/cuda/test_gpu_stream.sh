#!/bin/bash
# Mount test of the GPU path's reads from nvme, without a GPU: a range a
# client asks the daemon to load ahead (PREFETCH) is read from the device
# whole, ahead of the client's pins and copies, however much of it the
# device's queue depth would let in flight at once.
#
# The nvme folder is an ext4 image on a loop device of its own, so that
# /proc/diskstats counts this mount's reads alone (the outside
# instrument); the test skips where no loop device can be had. 64K
# blocks, a 16M DRAM tier (256 slots), queue_depth=32: the shallow bound
# on prefetches in flight is 32 blocks, a stream's (a quarter of the
# slots) 64. A 24 MiB file is written and the mount remounted, so that
# DRAM holds none of it; the learned cycle and readahead are off, so that
# only the client's requests read the file. gpuproto's stream case then
# asks to load its first 96 blocks:
#   1. after the PREFETCH alone, the device has read at least 64 blocks
#      (a stream's bound): at 2582941 it read 32, the rest was left to
#      the PINs as demand reads, the drive idling between windows;
#   2. after one PIN of block 0, at least all 96: the daemon issues what
#      it could not at once at the connection's next request.
# Each count is taken once the device is idle: no request in flight and
# no sector read for a second, waited for 60 s at most.

. "$(dirname "$0")/../mount/lib.sh"
. "$(dirname "$0")/../mount/lib_fullfs.sh"

: "${GPUPROTO:?GPUPROTO must name the gpuproto test program}"

BS=65536
small_fs "$NVME" 256
[ "$SMALL_KIND" = ext4 ] || skip "no loop device: the device's reads cannot be counted"
LOOPDEV=$(basename "${SMALL_LOOPS[0]}")

# sectors_read: 512-byte sectors the loop device has read (diskstats field 6)
sectors_read() {
	awk -v d="$LOOPDEV" '$3 == d { print $6 }' /proc/diskstats
}

# reads_done: read requests it completed (field 4)
reads_done() {
	awk -v d="$LOOPDEV" '$3 == d { print $4 }' /proc/diskstats
}

# settle: wait until the loop device is idle, then print its sectors read
settle() {
	local last now same=0 i
	last=$(sectors_read)
	for ((i = 0; i < 600; i++)); do
		sleep 0.1
		now=$(sectors_read)
		if [ "$now" = "$last" ] &&
			[ "$(awk '{ print $1 + $2 }' "/sys/block/$LOOPDEV/inflight")" = 0 ]; then
			same=$((same + 1))
			[ $same -ge 10 ] && {
				echo "$now"
				return 0
			}
		else
			same=0
		fi
		last=$now
	done
	fail "the nvme folder's device did not go idle within 60 s"
}

# wait_for FILE: the client's word, 60 s at most
wait_for() {
	local i
	for ((i = 0; i < 600; i++)); do
		[ -e "$1" ] && return 0
		alive "$GP_PID" || fail "gpuproto stream ended early: $(cat "$T/gp.out")"
		sleep 0.1
	done
	fail "gpuproto stream did not reach $1 within 60 s"
}

OPTS="cuda=on,block=64K,queue_depth=32,prefetch=off,readahead=0"
TFS_DRAM=16M TFS_THREADS=4 tfs_mount "$OPTS"
head -c $((24 << 20)) /dev/urandom >"$T/data"
cp "$T/data" "$MNT/f" || fail "cannot write the file"
sync "$MNT/f"
tfs_umount || fail "unmount failed"
TFS_DRAM=16M TFS_THREADS=4 tfs_mount "$OPTS"

base=$(settle)
req0=$(reads_done)
run_bg "$GPUPROTO" stream "$MNT" f 96 "$T/ready" "$T/go" >"$T/gp.out" 2>&1
GP_PID=$BG
wait_for "$T/ready.1"
got1=$(($(settle) - base))
touch "$T/go.1"
wait_for "$T/ready.2"
got2=$(($(settle) - base))
touch "$T/go.2"
waitfor "$GP_PID" 60 || fail "gpuproto stream failed: $(cat "$T/gp.out")"
cat "$T/gp.out"
blk1=$((got1 * 512 / BS))
blk2=$((got2 * 512 / BS))
req=$(($(reads_done) - req0))
echo "the device read $blk1 blocks after the PREFETCH of 96, $blk2 after a PIN," \
	"in $req requests of $((got2 * 512 / (req > 0 ? req : 1) >> 10)) KiB on average"
[ $blk1 -ge 64 ] ||
	fail "a PREFETCH of 96 blocks read $blk1 from the device before any PIN, want >= 64"
[ $blk2 -ge 96 ] ||
	fail "after the next PIN the device had read $blk2 of the 96 blocks asked for"
cmp "$T/data" "$MNT/f" || fail "the file reads back different"
tfs_umount || fail "unmount failed"
echo "PASS"
