#!/bin/bash
# Mount test of libtensorfs-cuda on a GPU; skips (77) without one.
#
# 1. cuda=on: the daemon pins the arena with CUDA; random tensors of odd
#    sizes written at odd offsets from device memory read back exact,
#    through the library and through FUSE; holes read as zeros; a bad
#    device pointer fails without leaving a pin.
# 2. cuda=off: the same through the bounce buffer.

. "$(dirname "$0")/../mount/lib.sh"

: "${GPU_ROUNDTRIP:?GPU_ROUNDTRIP must name the gpu_roundtrip test program}"
out=$("$GPU_ROUNDTRIP" --probe)
[ $? -eq 77 ] && skip "${out#SKIP: }"

TFS_DRAM=1G tfs_mount "cuda=on"
grep -q "pinned for DMA by CUDA" "$LOG" || fail "the daemon did not pin the arena with CUDA"
"$GPU_ROUNDTRIP" "$MNT" zerocopy 40 || fail "round trips through the arena"
tfs_umount || fail "unmount"

TFS_DRAM=1G tfs_mount ""
"$GPU_ROUNDTRIP" "$MNT" fallback 20 || fail "round trips through the bounce buffer"
tfs_umount || fail "unmount"
echo "PASS"
