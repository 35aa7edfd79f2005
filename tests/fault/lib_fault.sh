# Shared helpers for the fault injection tests. Source it from a test.
#
# The mount helpers of tests/mount/lib.sh come with it (and those of
# tests/s3/lib_s3.sh when FAULT_S3=1 is set first). A test skips (77)
# unless the build has fault injection (meson -Dfault_injection=true sets
# TFS_FAULT_INJECTION=1 for these tests). The daemon reads its rules from
# $T/faults (TENSORFS_FAULT_FILE; see tiers/fault.h) whenever that file
# changes, so a test turns faults on and off on a live mount:
#
#   fault_set RULE...   replace the rules (one per argument)
#   fault_off           no rules
#   fault_count         faults injected so far, from the daemon's log
#   fault_alive         fail unless the daemon runs and the mount answers
#   tfs_fsck            tfsctl fsck on the metadata store (daemon stopped);
#                       fails on problems; says so once if tfsctl is missing
#   fio_py ARGS...      tests/fault/faultio.py, failing the test if it does

if [ "${FAULT_S3:-0}" = 1 ]; then
	. "$(dirname "${BASH_SOURCE[0]}")/../s3/lib_s3.sh" # and the mount helpers
else
	. "$(dirname "${BASH_SOURCE[0]}")/../mount/lib.sh"
fi

[ "${TFS_FAULT_INJECTION:-0}" = 1 ] ||
	skip "this build has no fault injection (meson configure -Dfault_injection=true)"
command -v python3 >/dev/null || skip "python3 not found"

FAULTIO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/faultio.py"
export TENSORFS_FAULT_FILE="$T/faults"
unset TENSORFS_FAULT
: "${TFSCTL:=$(dirname "$TENSORFS")/../tools/tfsctl/tfsctl}"

fault_set() {
	printf '%s\n' "$@" >"$T/faults.new" && mv "$T/faults.new" "$T/faults" ||
		fail "cannot write the fault rules"
}

fault_off() {
	rm -f "$T/faults"
}

fault_count() {
	grep -c "fault injected:" "$LOG" || true
}

fault_alive() {
	[ -n "$TFS_PID" ] && kill -0 "$TFS_PID" 2>/dev/null || fail "the daemon died ($*)"
	is_mounted "$MNT" || fail "the mount went away ($*)"
	stat "$MNT/.tensorfs/stats" >/dev/null || fail "the mount does not answer ($*)"
}

# The daemon logs that it reads the rule file: proof that the binary has
# fault injection compiled in, so that a test cannot pass by injecting nothing.
fault_check_build() {
	grep -q "fault injection: rules from $T/faults" "$LOG" ||
		fail "TFS_FAULT_INJECTION=1 but the daemon does not read $T/faults"
}

fsck_warned=0
tfs_fsck() {
	local out
	if [ ! -x "$TFSCTL" ]; then
		[ $fsck_warned -eq 1 ] || echo "note: $TFSCTL not built; the store is not fsck-checked"
		fsck_warned=1
		return 0
	fi
	out=$("$TFSCTL" fsck "$META" 2>&1) || fail "tfsctl fsck $META: exit $?: $out"
	echo "   fsck: $(echo "$out" | tail -n 1)"
}

fio_py() {
	python3 "$FAULTIO" "$@" || fail "faultio.py $1 failed (exit $?)"
}

# json_get JSON KEY: a number from faultio.py's summary, 0 when absent.
json_get() {
	python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2], 0))' "$1" "$2"
}
