#!/bin/bash
# fsx on a tensorfs mount: random writes, reads, truncates, fallocates, hole
# punches, copies and renames, every read compared with fsx's model.
#
# The DRAM tier (32M, or 20M with 64K blocks) is small next to the four files
# of up to 16 MiB, so blocks are evicted and come back from the nvme tier;
# each run must see evictions and reads from nvme0. fsx remounts the
# filesystem every quarter of its operations and compares whole files after
# each remount. Three runs of 20,000 operations:
#   1. buffered I/O, default block size;
#   2. O_DIRECT (4 KiB aligned, 1 KiB now and then), default block size;
#   3. buffered I/O, block=64K, on a fresh filesystem (many more blocks).
#
# fsx asks for a remount through a FIFO: this shell owns the daemon, so the
# remount goes through tfs_umount (which checks that the daemon exits 0 after
# writing back) and tfs_mount. Seeds come from FSX_SEED, or are drawn here,
# and are printed; rerun with FSX_SEED=S to repeat all three runs.

. "$(dirname "$0")/lib.sh"

: "${FSX:?FSX must name the fsx binary}"
[ -x "$FSX" ] || skip "no fsx binary at $FSX"

FSX_OPS=${FSX_OPS:-12000}
REMOUNT_EVERY=$((FSX_OPS / 4))
SEED0=${FSX_SEED:-$(((RANDOM << 15 | RANDOM) % 1000000000))}
FSX_PID=""
MOUNT_OPTS=""
EVICTIONS=0

tfs_extra_cleanup() {
	# release a remount helper blocked on the FIFO, then stop fsx
	if [ -p "$ACK" ]; then
		exec 4<>"$ACK"
		echo fail >&4
		exec 4>&-
	fi
	if [ -n "$FSX_PID" ]; then
		kill "$FSX_PID" 2>/dev/null
		wait "$FSX_PID" 2>/dev/null
	fi
}

REQ="$T/remount.req"
ACK="$T/remount.ack"
mkfifo "$REQ" "$ACK"
cat >"$T/remount.sh" <<EOF
#!/bin/sh
# Asked by fsx (its files closed): have the test shell remount, wait for it.
echo remount >"$REQ" || exit 1
read -r answer <"$ACK" || exit 1
[ "\$answer" = ok ]
EOF
chmod +x "$T/remount.sh"

# tfs_mount with $MOUNT_OPTS, which may be empty.
mount_fs() {
	if [ -n "$MOUNT_OPTS" ]; then
		tfs_mount "$MOUNT_OPTS"
	else
		tfs_mount
	fi
}

# Called with fsx's remount request pending.
serve_remount() {
	local rc=0 ev
	ev=$(tfs_stat_json cache evictions) || fail "no stats before remount"
	EVICTIONS=$((EVICTIONS + ev))
	tfs_umount || rc=$?
	if [ $rc -ne 0 ]; then
		echo fail >"$ACK"
		fail "tensorfs exited $rc after unmount (opts $MOUNT_OPTS)"
	fi
	mount_fs
	echo ok >"$ACK"
}

# run_fsx NAME SEED FSX-ARGS... : fsx in $MNT/NAME, serving its remounts.
run_fsx() {
	local name=$1 seed=$2 rc=0 remounts=0 ev
	shift 2
	# count from here: the mount may have served an earlier run
	ev=$(tfs_stat_json cache evictions) || fail "no stats"
	EVICTIONS=$((-ev))
	mkdir "$MNT/$name" || fail "mkdir $MNT/$name"
	echo "== fsx $name: seed $seed, mount options: $MOUNT_OPTS"
	exec 3<>"$REQ"
	"$FSX" --seed "$seed" --ops "$FSX_OPS" --remount-cmd "$T/remount.sh" \
		--remount-every "$REMOUNT_EVERY" --check-every 2500 "$@" "$MNT/$name" 3<&- &
	FSX_PID=$!
	while kill -0 "$FSX_PID" 2>/dev/null; do
		if read -r -t 1 -u 3 _; then
			serve_remount
			remounts=$((remounts + 1))
		fi
	done
	exec 3<&-
	wait "$FSX_PID" || rc=$?
	FSX_PID=""
	[ $rc -eq 0 ] || fail "fsx $name failed (exit $rc), seed $seed; rerun with FSX_SEED=$SEED0"
	[ $remounts -ge 3 ] || fail "fsx $name asked for $remounts remounts, expected at least 3"
	echo "   $name: $remounts remounts, $EVICTIONS evictions before them"
	[ "$EVICTIONS" -gt 0 ] || fail "fsx $name: the cache never evicted; the run missed its point"
}

# Evidence that the run went through the nvme tier, not only through DRAM.
# The counters cover the time since the last remount, after which fsx read
# every file back whole, from nvme0.
check_tiers() {
	local what=$1 rb
	rb=$(tfs_stat_json tiers nvme0 read_bytes) || fail "$what: no stats"
	echo "   $what: nvme0 read_bytes $rb write_bytes $(tfs_stat_json tiers nvme0 write_bytes)," \
		"cache evictions $(tfs_stat_json cache evictions)"
	[ "$rb" -gt 0 ] || fail "$what: nothing was read back from nvme0"
	[ "$(tfs_stat_json tiers nvme0 errors)" -eq 0 ] || fail "$what: nvme0 errors"
	[ "$(tfs_stat_json tiers dram errors)" -eq 0 ] || fail "$what: dram errors"
}

echo "fsx seeds: buffered $SEED0, direct $((SEED0 + 1)), block=64K $((SEED0 + 2))"

# Small DRAM next to 4 files of up to 16 MiB: the cache must evict.
export TFS_DRAM=32M TFS_THREADS=8
MOUNT_OPTS=""
mount_fs
run_fsx buffered "$SEED0" --files 4
check_tiers "buffered run"
run_fsx direct "$((SEED0 + 1))" --files 4 --direct
check_tiers "direct run"
tfs_umount || fail "tensorfs exited $? after unmount"

# A fresh filesystem with 64 KiB blocks, and DRAM to match.
TFS_DRAM=20M
NVME="$T/nvme-64k"
# shellcheck disable=SC2034 # read by tfs_mount
META="$T/meta-64k"
mkdir -p "$NVME"
MOUNT_OPTS="block=64K"
mount_fs
[ "$(tfs_stat_json block_size)" -eq 65536 ] || fail "block=64K gave block_size $(tfs_stat_json block_size)"
run_fsx block64k "$((SEED0 + 2))" --files 4 --block 64K
check_tiers "block=64K run"
tfs_umount || fail "tensorfs exited $? after unmount"

echo "PASS: fsx buffered, direct and block=64K (seeds $SEED0, $((SEED0 + 1)), $((SEED0 + 2)))"
exit 0
