# Shared helpers for mount-level tests. Source it from a test script.
#
# Each test gets a fresh work folder ($T) holding the mount point ($MNT),
# one or more nvme folders and the metadata folder. tfs_mount starts the
# daemon in the foreground (-f) in the background of the shell, so the test
# knows its pid and can wait for it or kill it. The EXIT trap unmounts and
# stops whatever the test left, on every path, failure included.
#
# Exit codes follow the liburing convention: 0 pass, 1 fail, 77 skip.

set -u

: "${TENSORFS:?TENSORFS must name the tensorfs binary}"
TFS_PID=""
T=$(mktemp -d "${TMPDIR:-/var/tmp}/tfs-test.XXXXXX")
MNT="$T/mnt"
NVME="$T/nvme0"
META="$T/meta"
LOG="$T/daemon.log"
mkdir -p "$MNT" "$NVME"

fail() {
	echo "FAIL: $*" >&2
	if [ -s "$LOG" ]; then
		echo "--- daemon log (last 30 lines) ---" >&2
		tail -n 30 "$LOG" >&2
	fi
	exit 1
}

skip() {
	echo "SKIP: $*" >&2
	exit 77
}

is_mounted() {
	awk -v m="$1" '$2 == m { found = 1 } END { exit !found }' /proc/mounts
}

# tfs_mount [extra -o options] : mount $MNT on $NVME/$META, wait until live.
tfs_mount() {
	local opts="nvme=$NVME,meta=$META,dram=${TFS_DRAM:-256M},threads=${TFS_THREADS:-16}"
	[ -n "${1:-}" ] && opts="$opts,$1"
	"$TENSORFS" -f -o "$opts" "$MNT" >>"$LOG" 2>&1 &
	TFS_PID=$!
	local i
	for i in $(seq 1 200); do
		if is_mounted "$MNT"; then
			return 0
		fi
		if ! kill -0 "$TFS_PID" 2>/dev/null; then
			wait "$TFS_PID"
			TFS_PID=""
			fail "tensorfs exited before mounting (opts $opts)"
		fi
		sleep 0.05
	done
	fail "tensorfs did not mount within 10 s"
}

# tfs_umount: clean unmount, then wait for the daemon to write back and exit.
# Returns the daemon's exit status.
tfs_umount() {
	local rc=0
	if is_mounted "$MNT"; then
		fusermount3 -u "$MNT" || fail "fusermount3 -u $MNT failed"
	fi
	if [ -n "$TFS_PID" ]; then
		wait "$TFS_PID" || rc=$?
		TFS_PID=""
	fi
	return $rc
}

# tfs_kill9: crash the daemon, then detach the dead mount.
tfs_kill9() {
	[ -n "$TFS_PID" ] || fail "tfs_kill9: no daemon"
	kill -9 "$TFS_PID"
	wait "$TFS_PID" 2>/dev/null
	TFS_PID=""
	fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null
	true
}

# tfs_stat_json KEY... : print a value from /.tensorfs/stats, e.g.
#   tfs_stat_json tiers nvme0 used
tfs_stat_json() {
	python3 - "$MNT/.tensorfs/stats" "$@" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    v = v[k]
print(v)
PY
}

# alive PID: the process runs (a zombie, exited and not yet reaped, does not).
alive() {
	local st
	read -r st 2>/dev/null <"/proc/$1/stat" || return 1
	st=${st##*) } # the state follows the command's name in parentheses
	[ "${st%% *}" != Z ]
}

# waitfor PID SECS: the status of background job PID if it ends within
# SECS, else 124. A process waiting on a request that the daemon has taken
# and never answers cannot be killed, not even by SIGKILL, so timeout(1)
# would wait for it too: such a process is left behind here, and freed
# when the cleanup kills the daemon.
waitfor() {
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		if ! alive "$1"; then
			wait "$1"
			return
		fi
		sleep 0.1
	done
	return 124
}

# within SECS CMD...: run CMD, with waitfor's bound. Send its output to a
# file, not a pipe: $(...) waits for every process that holds the pipe.
within() {
	local secs=$1
	shift
	"$@" &
	waitfor $! "$secs"
}

# tfs_stacks: the daemon's threads on stderr, each with its kernel stack
# and, where gdb is installed, its user stack: for a test that found a
# request never answered, so that the hang shows where it waits.
tfs_stacks() {
	local t
	[ -n "$TFS_PID" ] || return 0
	echo "--- daemon threads (pid $TFS_PID) ---" >&2
	for t in /proc/"$TFS_PID"/task/*; do
		echo "thread ${t##*/} $(cat "$t/comm" 2>/dev/null) in $(cat "$t/wchan" 2>/dev/null)"
		cat "$t/stack" 2>/dev/null
	done >&2
	if command -v gdb >/dev/null; then
		timeout 60 gdb -p "$TFS_PID" -batch -ex "thread apply all bt" 2>&1 |
			grep -v '^\[New LWP' >&2
	fi
}

tfs_cleanup() {
	local rc=$? i
	if is_mounted "$MNT"; then
		fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null
	fi
	if [ -n "$TFS_PID" ]; then
		kill "$TFS_PID" 2>/dev/null
		# A daemon stuck inside a request never gets to its exit: 10 s, then KILL.
		for i in $(seq 1 100); do
			alive "$TFS_PID" || break
			sleep 0.1
		done
		alive "$TFS_PID" && kill -9 "$TFS_PID" 2>/dev/null
		wait "$TFS_PID" 2>/dev/null
	fi
	if declare -F tfs_extra_cleanup >/dev/null; then
		tfs_extra_cleanup
	fi
	rm -rf "$T"
	exit $rc
}
trap tfs_cleanup EXIT
