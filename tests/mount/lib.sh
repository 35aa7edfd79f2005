# Shared helpers for mount-level tests. Source it from a test script.
#
# Each test gets a fresh work folder ($T) holding the mount point ($MNT),
# one or more nvme folders and the metadata folder. tfs_mount starts the
# daemon in the foreground (-f) in the background of the shell, so the test
# knows its pid and can wait for it or kill it. The EXIT trap unmounts and
# stops whatever the test left, on every path, failure included. A
# watchdog prints where the test and its daemons wait while it runs long
# (tfs_watchdog), so that a hang shows in the test's log.
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

# tfs_mount [extra -o options] : mount $MNT on $NVME/$META, wait until live,
# TFS_MOUNT_S seconds at most (default 10; longer where the start waits for
# the store's previous daemon). TFS_SOURCE, when set, is the SOURCE argument.
tfs_mount() {
	local opts="nvme=$NVME,meta=$META,dram=${TFS_DRAM:-256M},threads=${TFS_THREADS:-16}"
	[ -n "${1:-}" ] && opts="$opts,$1"
	"$TENSORFS" -f -o "$opts" ${TFS_SOURCE+"$TFS_SOURCE"} "$MNT" >>"$LOG" 2>&1 &
	TFS_PID=$!
	local i
	for i in $(seq 1 $((${TFS_MOUNT_S:-10} * 20))); do
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
	fail "tensorfs did not mount within ${TFS_MOUNT_S:-10} s"
}

# tfs_start OPTS: start the daemon with the whole -o OPTS as tfs_mount does,
# where a refusal is what the test may want: 0 once mounted (TFS_PID set),
# else the daemon's exit status (over 128: it died by a signal), or 124 when
# it neither mounted nor exited within 30 s.
tfs_start() {
	local i rc
	"$TENSORFS" -f -o "$1" "$MNT" >>"$LOG" 2>&1 &
	TFS_PID=$!
	for i in $(seq 1 600); do
		is_mounted "$MNT" && return 0
		if ! alive "$TFS_PID"; then
			rc=0
			wait "$TFS_PID" || rc=$?
			TFS_PID=""
			return $rc
		fi
		sleep 0.05
	done
	return 124
}

# tfs_umount: clean unmount, then wait for the daemon to write back and exit,
# TFS_UMOUNT_S seconds at most (default 180; then it fails, with the
# daemon's threads). Returns the daemon's exit status.
tfs_umount() {
	local rc=0
	if is_mounted "$MNT"; then
		fusermount3 -u "$MNT" || fail "fusermount3 -u $MNT failed"
	fi
	if [ -n "$TFS_PID" ]; then
		# Bounded: a daemon that never ends shows where it is, and fails.
		waitfor "$TFS_PID" "${TFS_UMOUNT_S:-180}" || rc=$?
		if [ $rc -eq 124 ] && alive "$TFS_PID"; then
			tfs_stacks
			fail "the daemon did not end within ${TFS_UMOUNT_S:-180} s of its unmount"
		fi
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

# tfs_kill_pidfile: crash the daemon whose pid $T/daemon.pid holds, where
# another program started it (the crash matrix), then detach its mount.
tfs_kill_pidfile() {
	local pid
	pid=$(cat "$T/daemon.pid" 2>/dev/null)
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -9 "$pid" 2>/dev/null
		sleep 0.2
	fi
	is_mounted "$MNT" && { fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT"; }
	true
}

# tfs_daemons [KEEP]: pids of the tensorfs processes whose command line
# names this test's work folder ($T), but KEEP.
tfs_daemons() {
	python3 - "$T" "${1:-}" <<'PY'
import os, sys
work, keep = sys.argv[1].encode(), sys.argv[2]
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == os.getpid() or p == keep:
        continue
    try:
        argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if argv and os.path.basename(argv[0]).startswith(b"tensorfs") and \
            any(work in a for a in argv):
        print(p)
PY
}

# readcheck NAME...: read every 1 MiB block of each file $MNT/NAME, checked
# against its source $T/NAME; print "NAME IDX" for each that fails with EIO.
# Fails when one reads back other bytes than its source, or fails otherwise.
readcheck() {
	python3 - "$MNT" "$T" "$@" <<'PY' || fail "a block read back wrong (see above)"
import errno, os, sys
mnt, tdir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
bs, bad = 1 << 20, 0
for n in names:
    want = open(f"{tdir}/{n}", "rb").read()
    fd = os.open(f"{mnt}/{n}", os.O_RDONLY)
    for i in range((len(want) + bs - 1) // bs):
        try:
            got = os.pread(fd, bs, i * bs)
        except OSError as e:
            if e.errno != errno.EIO:
                print(f"{n} block {i}: {e}", file=sys.stderr)
                bad = 1
            else:
                print(n, i)
            continue
        if got != want[i * bs:(i + 1) * bs]:
            print(f"{n} block {i} reads back other bytes, with no error", file=sys.stderr)
            bad = 1
    os.close(fd)
sys.exit(bad)
PY
}

# flip_byte FILE OFFSET: invert the byte of FILE at OFFSET.
flip_byte() {
	python3 - "$1" "$2" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
off = int(sys.argv[2])
b = os.pread(fd, 1, off)
os.pwrite(fd, bytes([b[0] ^ 0xff]), off)
os.close(fd)
PY
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

# tfs_stacks: the daemon's threads on stderr, a line each with its kernel
# stack and, where gdb is installed, its user stack (stacks.py): for a test
# that found a request never answered, so that the hang shows where it waits.
tfs_stacks() {
	[ -n "$TFS_PID" ] || return 0
	python3 "$(dirname "${BASH_SOURCE[0]}")/stacks.py" "$TFS_PID" >&2
}

# The watchdog: while a test runs, every TFS_WATCHDOG_S seconds (default
# 100, under the shortest meson timeout of a mount test, 120) it prints
# every process the test started with where it sleeps, and the threads of
# every daemon among them. A test that hung then shows where it waits when
# meson's timeout ends it (the last print is the end of its log); a slow
# one that passes printed to a log nobody reads. tfs_cleanup stops it.
tfs_watchdog() {
	local top=$1 p pids daemons secs=0
	for (( ; ; )); do
		sleep "${TFS_WATCHDOG_S:-100}" &
		wait $!
		secs=$((secs + ${TFS_WATCHDOG_S:-100}))
		echo "--- watchdog: $0 still running after $secs s; its processes: ---" >&2
		pids=$(descendants "$top" | grep -vx "$BASHPID")
		ps -o pid,etimes,stat,wchan:24,args -p "$(echo $pids | tr ' ' ,)" | cut -c1-160 >&2
		daemons=()
		for p in $pids; do
			[ "$(cat "/proc/$p/comm" 2>/dev/null)" = tensorfs ] && daemons+=("$p")
		done
		[ ${#daemons[@]} -eq 0 ] ||
			python3 "$(dirname "${BASH_SOURCE[0]}")/stacks.py" "${daemons[@]}" >&2
	done
}

# descendants PID: the processes under PID, children first.
descendants() {
	local c
	for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
		echo "$c"
		descendants "$c"
	done
}

tfs_cleanup() {
	local rc=$? i
	if [ -n "${TFS_WATCHDOG_PID:-}" ]; then
		# the watchdog, then its sleep, which holds the test's output open
		i=$(pgrep -P "$TFS_WATCHDOG_PID")
		kill "$TFS_WATCHDOG_PID" 2>/dev/null
		wait "$TFS_WATCHDOG_PID" 2>/dev/null
		[ -z "$i" ] || kill $i 2>/dev/null
	fi
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
		if alive "$TFS_PID"; then
			echo "cleanup: the daemon did not end 10 s after SIGTERM; where it is:" >&2
			tfs_stacks
			kill -9 "$TFS_PID" 2>/dev/null
		fi
		# not for ever: a thread in an uninterruptible wait outlives SIGKILL
		waitfor "$TFS_PID" 30 >/dev/null 2>&1
		alive "$TFS_PID" && echo "cleanup: the daemon (pid $TFS_PID) outlives SIGKILL" >&2
	fi
	if declare -F tfs_extra_cleanup >/dev/null; then
		tfs_extra_cleanup
	fi
	rm -rf "$T"
	exit $rc
}
trap tfs_cleanup EXIT
tfs_watchdog $$ &
TFS_WATCHDOG_PID=$!
