# The fsx driver, shared by the mount and s3 fsx tests. Source it after
# lib.sh (or lib_s3.sh); it needs $FSX.
#
# fsx remounts the filesystem every so many operations and then compares
# whole files, so every block comes back from its tier. It asks for a
# remount through a FIFO: this shell owns the daemon, so the remount goes
# through tfs_umount (which checks that the daemon exits 0 after writing
# back) and tfs_mount "$MOUNT_OPTS".
#
#   fsx_run NAME SEED FSX-ARGS...   fsx in $MNT/NAME, serving its remounts,
#                                   at least 3 of them; fails the test if
#                                   fsx fails
#   fsx_cleanup                     from the test's cleanup: free a remount
#                                   helper waiting on the FIFO, stop fsx
#   fsx_before_remount              if the test defines it: called at each
#                                   remount, before the unmount
#
# FSX_OPS (the test's default) is the length of a run, REMOUNT_EVERY a
# quarter of it; SEED0 (from FSX_SEED, else drawn) is the first seed.

: "${FSX:?FSX must name the fsx binary}"
[ -x "$FSX" ] || skip "no fsx binary at $FSX"

: "${FSX_OPS:=12000}"
REMOUNT_EVERY=$((FSX_OPS / 4))
SEED0=${FSX_SEED:-$(((RANDOM << 15 | RANDOM) % 1000000000))}
FSX_PID=""
MOUNT_OPTS=""

FSX_REQ="$T/remount.req"
FSX_ACK="$T/remount.ack"
mkfifo "$FSX_REQ" "$FSX_ACK"
cat >"$T/remount.sh" <<EOF_HELPER
#!/bin/sh
# Asked by fsx (its files closed): have the test shell remount, wait for it.
echo remount >"$FSX_REQ" || exit 1
read -r answer <"$FSX_ACK" || exit 1
[ "\$answer" = ok ]
EOF_HELPER
chmod +x "$T/remount.sh"

fsx_cleanup() {
	if [ -p "$FSX_ACK" ]; then
		exec 4<>"$FSX_ACK"
		echo fail >&4
		exec 4>&-
	fi
	if [ -n "$FSX_PID" ]; then
		kill "$FSX_PID" 2>/dev/null
		wait "$FSX_PID" 2>/dev/null
	fi
}

# Called with fsx's remount request pending.
fsx_serve_remount() {
	local rc=0
	if declare -F fsx_before_remount >/dev/null; then
		fsx_before_remount
	fi
	tfs_umount || rc=$?
	if [ $rc -ne 0 ]; then
		echo fail >"$FSX_ACK"
		fail "tensorfs exited $rc after unmount (opts $MOUNT_OPTS)"
	fi
	tfs_mount "$MOUNT_OPTS"
	echo ok >"$FSX_ACK"
}

fsx_run() {
	local name=$1 seed=$2 rc=0 remounts=0
	shift 2
	mkdir "$MNT/$name" || fail "mkdir $MNT/$name"
	echo "== fsx $name: seed $seed, mount options: $MOUNT_OPTS"
	exec 3<>"$FSX_REQ"
	"$FSX" --seed "$seed" --ops "$FSX_OPS" --remount-cmd "$T/remount.sh" \
		--remount-every "$REMOUNT_EVERY" "$@" "$MNT/$name" 3<&- &
	FSX_PID=$!
	while kill -0 "$FSX_PID" 2>/dev/null; do
		if read -r -t 1 -u 3 _; then
			fsx_serve_remount
			remounts=$((remounts + 1))
		fi
	done
	exec 3<&-
	wait "$FSX_PID" || rc=$?
	FSX_PID=""
	[ $rc -eq 0 ] || fail "fsx $name failed (exit $rc), seed $seed; rerun with FSX_SEED=$SEED0"
	[ $remounts -ge 3 ] || fail "fsx $name asked for $remounts remounts, expected at least 3"
}
