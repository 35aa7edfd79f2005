#!/bin/bash
# Mount test of cuda/tensorfs_offload.py on CPU tensors: activations saved
# for backward go to files on a cuda=on mount through the zero-copy
# protocol (libtensorfs-cuda built with the memcpy engine), and training
# gives bitwise the same losses and weights as without it; the files are
# gone after backward, a budget bounds what goes, and nothing reaches nvme
# (dirty_expire_ms is raised so that only eviction could write back, and
# the DRAM tier holds every activation). Needs Debian's python3-torch:
# skips (77) without it, except under CI, where that fails.

. "$(dirname "$0")/../mount/lib.sh"

: "${TENSORFS_CUDA_LIB:?TENSORFS_CUDA_LIB must name libtensorfs-cuda-cpu.so}"
if ldd "$TENSORFS_CUDA_LIB" 2>/dev/null | grep -q "libasan\|libubsan"; then
	skip "the client library is built with sanitizers, which python cannot load"
fi
# The python3 on PATH may not be Debian's (pyenv, a venv): take one that has torch.
PY=""
for p in python3 /usr/bin/python3; do
	if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then
		PY=$p
		break
	fi
done
if [ -z "$PY" ]; then
	[ -n "${CI:-}" ] && fail "torch is not importable (apt-get install python3-torch)"
	skip "torch is not importable"
fi
export TENSORFS_CUDA_LIB
export OFFLOAD_MODULE_DIR="$(cd "$(dirname "$0")/../../cuda" && pwd)"

TFS_DRAM=256M TFS_THREADS=4 tfs_mount "cuda=on,dirty_expire_ms=600000"
"$PY" "$(dirname "$0")/offload_check.py" "$MNT" || fail "offloading activations"
[ "$(tfs_stat_json tiers nvme0 write_bytes)" = 0 ] || fail "nvme0 wrote while the mount was up"
tfs_umount || fail "unmount"
echo "PASS"
