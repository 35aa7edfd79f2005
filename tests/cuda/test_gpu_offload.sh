#!/bin/bash
# Mount test of cuda/tensorfs_offload.py on CPU tensors: activations saved
# for backward go to files on a cuda=on mount through the zero-copy
# protocol (libtensorfs-cuda built with the memcpy engine), and training
# gives bitwise the same losses and weights as without it; the files are
# gone after backward, a budget bounds what goes, and nothing reaches nvme
# (dirty_expire_ms is raised so that only eviction could write back, and
# the DRAM tier holds every activation).
#
# Then real memory (offload_mem.py, one process per mode, RssAnon sampled
# every 2 ms, MALLOC_MMAP_THRESHOLD_=65536 so that a freed tensor leaves
# at once), with the CPU copy engine held to TENSORFS_CPU_COPY_GBPS=0.5
# each way, so that the copies lag the compute as on a GPU: 16 tanh
# layers of 8 MiB (128 MiB saved a step), 5 steps, budgets none, 1.0 and
# auto.
#   - 1.0: every step's peak is below none's by the 128 MiB offloaded less
#     32 MiB at most (four of its tensors: the window of two saved and not
#     yet written, one being computed, one read back); the step peaks
#     differ by at most 8 MiB (no growth from step to step);
#   - auto: no step's peak is above none's (8 MiB of slack);
#   - the losses and gradients are bitwise those of none.
# Needs Debian's python3-torch: skips (77) without it, except under CI,
# where that fails. OFFLOAD_MODULE_DIR may name another tree's cuda/ (to
# run an older offloader against this test).

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
export OFFLOAD_MODULE_DIR="${OFFLOAD_MODULE_DIR:-$(cd "$(dirname "$0")/../../cuda" && pwd)}"

TFS_DRAM=256M TFS_THREADS=4 tfs_mount "cuda=on,dirty_expire_ms=600000"
"$PY" "$(dirname "$0")/offload_check.py" "$MNT" || fail "offloading activations"
[ "$(tfs_stat_json tiers nvme0 write_bytes)" = 0 ] || fail "nvme0 wrote while the mount was up"
tfs_umount || fail "unmount"

echo "real memory, one process per mode"
TFS_DRAM=1G TFS_THREADS=4 tfs_mount "cuda=on,dirty_expire_ms=600000"
# mem MODE: offload_mem.py's line for MODE in $T/mem-MODE
mem() {
	MALLOC_MMAP_THRESHOLD_=65536 TENSORFS_CPU_COPY_GBPS=0.5 \
		"$PY" "$(dirname "$0")/offload_mem.py" "$MNT" "$1" 5 >"$T/mem-$1" ||
		fail "offload_mem.py $1"
}
# check MODE...: the runs' peaks against none's (the header says what must hold)
check() {
	"$PY" - "$@" <<'PY'
import json, sys

MIB = 1024   # KiB
runs = {m: json.load(open(sys.argv[1] + "/mem-" + m)) for m in ["none"] + sys.argv[2:]}
none = runs["none"]
floor, top = min(none["peaks_kib"]), max(none["peaks_kib"])
for mode, r in runs.items():
    rel = [(p - r["before_kib"]) // MIB for p in r["peaks_kib"]]
    print("   %-5s peak RssAnon over the start, MiB, by step: %s; ms: %s"
          % (mode, rel, [round(v) for v in r["ms"]]))
    assert None not in r["peaks_kib"], "a step without a sample"
    assert r["losses"] == none["losses"] and r["grads"] == none["grads"], \
        "%s: losses %s, gradients %s; none: %s, %s" % (
            mode, r["losses"], r["grads"], none["losses"], none["grads"])
full = runs.get("1.0")
if full:
    off_mib = full["saved_bytes"] >> 20
    assert all(c == full["saved_bytes"] for c in full["chosen_bytes"]), full["chosen_bytes"]
    for i, p in enumerate(full["peaks_kib"]):
        saved = (floor - p) // MIB
        assert saved >= off_mib - 32, \
            "1.0, step %d: peak %d MiB below none's, want >= %d - 32" % (i + 1, saved, off_mib)
    spread = (max(full["peaks_kib"]) - min(full["peaks_kib"])) // MIB
    assert spread <= 8, "1.0: the step peaks differ by %d MiB" % spread
    print("   1.0 saves %d-%d MiB of the %d offloaded"
          % ((floor - max(full["peaks_kib"])) // MIB, (floor - min(full["peaks_kib"])) // MIB,
             off_mib))
auto = runs.get("auto")
if auto:
    for i, p in enumerate(auto["peaks_kib"]):
        assert p <= top + 8 * MIB, "auto, step %d: peak %d MiB above none's" % (
            i + 1, (p - top) // MIB)
    print("   auto chose %s MiB a step" % [c >> 20 for c in auto["chosen_bytes"]])
PY
}
mem none
mem 1.0
check "$T" 1.0 || fail "memory with budget 1.0"
mem auto
check "$T" auto || fail "memory with budget auto"
tfs_umount || fail "unmount"
echo "PASS"
