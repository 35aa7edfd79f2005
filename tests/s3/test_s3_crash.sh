#!/bin/bash
# Crashes with packed objects: the crash matrix (tests/crash/crashmatrix.py)
# on a tier that is s3 alone (nvme=none, 8 blocks per object), s3rver up
# throughout. CRASH_ITERATIONS (default 8) rounds of a mixed workload killed
# with SIGKILL at a random point, then tfsctl fsck, a remount, and checks:
# every fsynced byte is intact, and the bucket holds exactly the objects the
# tier stores: what the crash left (objects written and never committed,
# objects whose blocks all died) is deleted at mount, none leaked.

. "$(dirname "$0")/lib_s3.sh"

command -v python3 >/dev/null || skip "python3 not found"
: "${TFSCTL:=}"

tfs_extra_cleanup() {
	tfs_kill_pidfile
	s3_stop
}

s3_start
args=(--tensorfs "$TENSORFS" --work "$T" --iterations "${CRASH_ITERATIONS:-8}"
	--nvme none --opts "$(s3_mount_opts crash),s3_object=8M"
	--objects "$S3_DATA/$S3_BUCKET/crash/*/pk")
[ -n "$TFSCTL" ] && args+=(--tfsctl "$TFSCTL")
[ -n "${CRASH_SEED:-}" ] && args+=(--seed "$CRASH_SEED")
python3 "$TFS_SRC/tests/crash/crashmatrix.py" "${args[@]}" || {
	echo "--- daemon log (last 30 lines) ---" >&2
	tail -n 30 "$T/daemon.log" >&2
	exit 1
}
# What the mounts after a crash found to delete: the leaks the check above
# would have caught had they stayed.
echo "   deleted at mount: $(sed -n 's/.* \([0-9]*\) of them to delete$/\1/p' "$T/daemon.log" |
	paste -sd' ') objects"
s3_secret_leaks "$T/daemon.log"
