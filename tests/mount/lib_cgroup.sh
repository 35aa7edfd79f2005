# Shared helpers for the mount tests that run the daemon in a cgroup of
# their own, under a limit a container or a service would set. Source it
# after tests/mount/lib.sh.
#
#   cg_make CONTROLLER LIMIT_FILE_V2 LIMIT_FILE_V1
#                 make $CG (v2, or v1's CONTROLLER hierarchy) with
#                 CONTROLLER on, or skip; LIMIT_FILE is the one of the two
#                 that this host has
#   cg_procs      the processes in it
#   cg_empty SECS wait until it holds no task (0), else 1
#   cg_start OPTS start the daemon in it in the background, as a service
#                 does (no -f: the status is its word on the mount), with
#                 -o OPTS, stderr in $T/stderr; the status in RC
# The EXIT trap (tfs_extra_cleanup) unmounts, ends what is left in $CG and
# removes it.

CG=""

cg_make() {
	local ctl=$1
	if [ -f /sys/fs/cgroup/cgroup.controllers ]; then # cgroup v2
		grep -qw "$ctl" /sys/fs/cgroup/cgroup.controllers || skip "no $ctl controller in cgroup v2"
		grep -qw "$ctl" /sys/fs/cgroup/cgroup.subtree_control ||
			echo "+$ctl" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
			skip "cannot enable the $ctl controller for child cgroups"
		CG=/sys/fs/cgroup/$(basename "$T")
		LIMIT_FILE=$2
	elif [ -d "/sys/fs/cgroup/$ctl" ]; then # cgroup v1
		CG=/sys/fs/cgroup/$ctl/$(basename "$T")
		LIMIT_FILE=$3
	else
		skip "no $ctl cgroup controller"
	fi
	mkdir "$CG" 2>/dev/null || { CG=""; skip "cannot make a cgroup (not root, or a read-only /sys/fs/cgroup)"; }
	[ -f "$CG/$LIMIT_FILE" ] || skip "$CG has no $LIMIT_FILE"
}

cg_procs() { cat "$CG/cgroup.procs" 2>/dev/null; }

cg_empty() {
	local i
	for i in $(seq 1 $(($1 * 10))); do
		# pids.current: a process that exited leaves its tasks counted a moment
		[ -z "$(cg_procs)" ] && [ "$(cat "$CG/pids.current" 2>/dev/null || echo 0)" -eq 0 ] &&
			return 0
		sleep 0.1
	done
	return 1
}

cg_start() {
	: >"$T/stderr"
	RC=0
	timeout 60 sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$CG" \
		"$TENSORFS" -o "$1" "$MNT" 2>"$T/stderr" || RC=$?
	[ $RC -ne 124 ] || fail "the daemon neither mounted nor exited within 60 s (-o $1)"
}

tfs_extra_cleanup() {
	local p i
	[ -n "$CG" ] && [ -d "$CG" ] || return 0
	is_mounted "$MNT" && { fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT"; }
	[ -f "$CG/pids.max" ] && echo max >"$CG/pids.max" 2>/dev/null
	for p in $(cg_procs); do kill "$p" 2>/dev/null; done
	for i in $(seq 1 100); do
		[ -z "$(cg_procs)" ] && break
		sleep 0.1
	done
	for p in $(cg_procs); do kill -9 "$p" 2>/dev/null; done
	sleep 0.2
	rmdir "$CG" 2>/dev/null
	true
}
