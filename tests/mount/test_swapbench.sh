#!/bin/bash
# swapbench's own verification and corruption tests, run against a tensorfs
# mount whose DRAM is smaller than the swap files, so that the data goes
# to the nvme tier and comes back.
. "$(dirname "$0")/lib.sh"

: "${SWAPBENCH:?SWAPBENCH must name the swapbench binary}"
SB_DIR="${TFS_SRC:-$(dirname "$0")/../..}/tools/swapbench"

TFS_DRAM=128M TFS_THREADS=8 tfs_mount
mkdir -p "$MNT/verify" "$MNT/corrupt" || fail "mkdir on the mount"

SWAPBENCH_TARGET="$MNT/verify" bash "$SB_DIR/test_verify.sh" ||
	fail "swapbench verification against tensorfs"
SWAPBENCH_TARGET="$MNT/corrupt" bash "$SB_DIR/test_corrupt.sh" ||
	fail "swapbench corruption test against tensorfs"

errors=$(tfs_stat_json fuse errors) || fail "stats unreadable"
tfs_umount || fail "daemon exited with an error"
echo "PASS: swapbench verified through tensorfs (fuse errors counted: $errors)"
