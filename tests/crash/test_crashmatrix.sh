#!/bin/bash
# The crash matrix (crashmatrix.py): CRASH_ITERATIONS (default 50) rounds
# of a mixed workload killed with SIGKILL at a random point, then fsck,
# remount and a check that every fsynced byte and every completed rename
# is intact. CRASH_SEED replays a run's workload; `CRASH_ITERATIONS=500
# meson test -C build crash-matrix` runs more.

. "$(dirname "$0")/../mount/lib.sh"

command -v python3 >/dev/null || skip "python3 not found"
: "${TFSCTL:=}"

tfs_extra_cleanup() {
	tfs_kill_pidfile
}

args=(--tensorfs "$TENSORFS" --work "$T" --iterations "${CRASH_ITERATIONS:-50}")
[ -n "$TFSCTL" ] && args+=(--tfsctl "$TFSCTL")
[ -n "${CRASH_SEED:-}" ] && args+=(--seed "$CRASH_SEED")
python3 "$(dirname "$0")/crashmatrix.py" "${args[@]}" || {
	echo "--- daemon log (last 30 lines) ---" >&2
	tail -n 30 "$T/daemon.log" >&2
	exit 1
}
