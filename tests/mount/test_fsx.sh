#!/bin/bash
# fsx on a tensorfs mount: random writes, reads, truncates, fallocates, hole
# punches, copies and renames, every read compared with fsx's model.
#
# The DRAM tier (32M, or 20M with 64K blocks) is small next to the four files
# of up to 16 MiB, so blocks are evicted and come back from the nvme tier;
# each run must see evictions and reads from nvme0. fsx remounts the
# filesystem every quarter of its operations and compares whole files after
# each remount. Three runs of 20,000 operations:
#   1. buffered I/O, default block size;
#   2. O_DIRECT (4 KiB aligned, 1 KiB now and then), default block size;
#   3. buffered I/O, block=64K, on a fresh filesystem (many more blocks).
#
# The driver (remounts through a FIFO) is lib_fsx.sh. Seeds come from
# FSX_SEED, or are drawn here, and are printed; rerun with FSX_SEED=S to
# repeat all three runs.

. "$(dirname "$0")/lib.sh"
FSX_OPS=${FSX_OPS:-12000}
. "$(dirname "$0")/lib_fsx.sh"

EVICTIONS=0
tfs_extra_cleanup() { fsx_cleanup; }

# Evictions are counted per mount: add each mount's before it goes.
fsx_before_remount() {
	local ev
	ev=$(tfs_stat_json cache evictions) || fail "no stats before remount"
	EVICTIONS=$((EVICTIONS + ev))
}

# run_fsx NAME SEED FSX-ARGS... : fsx_run, and the cache must have evicted.
run_fsx() {
	local name=$1 ev
	# count from here: the mount may have served an earlier run
	ev=$(tfs_stat_json cache evictions) || fail "no stats"
	EVICTIONS=$((-ev))
	fsx_run "$@" --check-every 2500
	echo "   $name: $EVICTIONS evictions before its remounts"
	[ "$EVICTIONS" -gt 0 ] || fail "fsx $name: the cache never evicted; the run missed its point"
}

# Evidence that the run went through the nvme tier, not only through DRAM.
# The counters cover the time since the last remount, after which fsx read
# every file back whole, from nvme0.
check_tiers() {
	local what=$1 rb
	rb=$(tfs_stat_json tiers nvme0 read_bytes) || fail "$what: no stats"
	echo "   $what: nvme0 read_bytes $rb write_bytes $(tfs_stat_json tiers nvme0 write_bytes)," \
		"cache evictions $(tfs_stat_json cache evictions)"
	[ "$rb" -gt 0 ] || fail "$what: nothing was read back from nvme0"
	[ "$(tfs_stat_json tiers nvme0 errors)" -eq 0 ] || fail "$what: nvme0 errors"
	[ "$(tfs_stat_json tiers dram errors)" -eq 0 ] || fail "$what: dram errors"
}

echo "fsx seeds: buffered $SEED0, direct $((SEED0 + 1)), block=64K $((SEED0 + 2))"

# Small DRAM next to 4 files of up to 16 MiB: the cache must evict.
export TFS_DRAM=32M TFS_THREADS=8
MOUNT_OPTS=""
tfs_mount "$MOUNT_OPTS"
run_fsx buffered "$SEED0" --files 4
check_tiers "buffered run"
run_fsx direct "$((SEED0 + 1))" --files 4 --direct
check_tiers "direct run"
tfs_umount || fail "tensorfs exited $? after unmount"

# A fresh filesystem with 64 KiB blocks, and DRAM to match.
TFS_DRAM=20M
NVME="$T/nvme-64k"
# shellcheck disable=SC2034 # read by tfs_mount
META="$T/meta-64k"
mkdir -p "$NVME"
MOUNT_OPTS="block=64K"
tfs_mount "$MOUNT_OPTS"
[ "$(tfs_stat_json block_size)" -eq 65536 ] || fail "block=64K gave block_size $(tfs_stat_json block_size)"
run_fsx block64k "$((SEED0 + 2))" --files 4 --block 64K
check_tiers "block=64K run"
tfs_umount || fail "tensorfs exited $? after unmount"

echo "PASS: fsx buffered, direct and block=64K (seeds $SEED0, $((SEED0 + 1)), $((SEED0 + 2)))"
exit 0
