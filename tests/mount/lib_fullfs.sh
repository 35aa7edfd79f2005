# Helpers for tests of a disk that another process fills: small
# filesystems to fill, processes started in the background, and the check
# that none of them is left waiting. Source it after lib.sh; it defines
# tfs_extra_cleanup, which lib.sh's EXIT trap calls.

SMALL_MOUNTS=()
SMALL_LOOPS=()
BG_PIDS=()

# small_fs DIR MIB: a filesystem of MIB MiB on DIR, 0700: ext4 in a loop
# image (as a node's scratch disk is), else a tmpfs with size= where loop
# devices cannot be had (a container). SMALL_KIND says which.
small_fs() {
	local dir=$1 mib=$2 img loop
	mkdir -p "$dir"
	if command -v losetup >/dev/null 2>&1 && command -v mkfs.ext4 >/dev/null 2>&1; then
		img="$T/$(basename "$dir").img"
		if truncate -s "${mib}M" "$img" && mkfs.ext4 -q -F "$img" >/dev/null 2>&1 &&
			loop=$(losetup -f --show "$img" 2>/dev/null); then
			if mount "$loop" "$dir" 2>/dev/null; then
				SMALL_LOOPS+=("$loop")
				SMALL_MOUNTS+=("$dir")
				chmod 700 "$dir"
				SMALL_KIND=ext4
				return 0
			fi
			losetup -d "$loop"
		fi
		rm -f "$img"
	fi
	mount -t tmpfs -o "size=${mib}m,mode=0700" tmpfs "$dir" 2>/dev/null ||
		skip "cannot mount a loop image or a tmpfs (needs root)"
	SMALL_MOUNTS+=("$dir")
	SMALL_KIND=tmpfs
}

# run_bg CMD...: run CMD in the background; BG is its pid. The cleanup ends it.
run_bg() {
	"$@" &
	BG=$!
	BG_PIDS+=("$BG")
}

# pstate PID: the process's state letter (R, S, D...), or "gone".
pstate() {
	local st
	read -r st 2>/dev/null <"/proc/$1/stat" || {
		echo gone
		return
	}
	st=${st##*) }
	echo "${st%% *}"
}

# fs_avail DIR: bytes an unprivileged writer may still put on DIR's filesystem.
fs_avail() {
	python3 -c 'import os, sys; v = os.statvfs(sys.argv[1]); print(v.f_bavail * v.f_frsize)' "$1"
}

# fill DIR NAME: write zeros to DIR/NAME until the filesystem is full.
fill() {
	dd if=/dev/zero of="$1/$2" bs=1M status=none 2>/dev/null
	sync -f "$1/$2" 2>/dev/null
	true
}

tfs_extra_cleanup() {
	local p i
	for p in "${BG_PIDS[@]}"; do
		kill -9 "$p" 2>/dev/null
	done
	# The daemon is gone: the mount's requests ended with it. Wait a moment
	# for the processes to leave the small filesystems before unmounting them.
	for p in "${BG_PIDS[@]}"; do
		for i in $(seq 1 50); do
			alive "$p" || break
			sleep 0.1
		done
	done
	for ((i = ${#SMALL_MOUNTS[@]} - 1; i >= 0; i--)); do
		umount "${SMALL_MOUNTS[$i]}" 2>/dev/null || umount -l "${SMALL_MOUNTS[$i]}"
	done
	for p in "${SMALL_LOOPS[@]}"; do
		losetup -d "$p" 2>/dev/null
	done
	true
}
