#!/bin/bash
# Mount test: tensorfs as a daemon, through mount(8), with defaults and with
# a config file.
#
# 1. Without -f the parent exits 0 once the mount is live; the daemon's pid
#    is in <meta>/lock; data survives fusermount3 -u and a second mount; the
#    daemon is gone after each unmount.
# 2. mount.fuse3 -t fuse.tensorfs and an fstab line (mount -T FILE) both
#    mount; umount ends the daemon.
# 3. With only a mount point and XDG_DATA_HOME set, the nvme folder is
#    $XDG_DATA_HOME/tensorfs, the DRAM tier is about a quarter of
#    MemAvailable, in transparent huge pages where the kernel has them,
#    and blocks are 1 MiB.
# 4. config=FILE sets dram, block, nvme and meta; -o wins over the file.
# 5. The daemon's I/O threads (each device's, and the flusher) run at nice
#    -10 when it runs as root, its FUSE threads at the default: a drive
#    must not wait for a CPU behind the FUSE threads' copies.

. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null 2>&1 || skip "python3 not found"
BINDIR=$(cd "$(dirname "$TENSORFS")" && pwd)

# our_daemons: pids of tensorfs processes whose command line names $T.
our_daemons() {
	tfs_daemons
}

tfs_extra_cleanup() {
	local p i
	for p in $(our_daemons); do kill "$p" 2>/dev/null; done
	for i in $(seq 1 100); do
		[ -z "$(our_daemons)" ] && return 0
		sleep 0.05
	done
	for p in $(our_daemons); do kill -9 "$p" 2>/dev/null; done
	true
}

# alive PID: the process exists and is not a zombie.
alive() {
	local s
	s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
	[ -n "$s" ] && [ "$s" != Z ]
}

# wait_gone PID: bounded wait (30 s) for a daemon to exit after unmount.
wait_gone() {
	local i
	for i in $(seq 1 300); do
		alive "$1" || return 0
		sleep 0.1
	done
	return 1
}

# lock_pid METADIR: the daemon pid recorded in METADIR/lock, checked.
lock_pid() {
	local pid argv0
	pid=$(head -n1 "$1/lock" 2>/dev/null | tr -d ' ')
	[ -n "$pid" ] || fail "$1/lock is missing or empty while mounted"
	alive "$pid" || fail "$1/lock names pid $pid, which is not running"
	argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n 1)
	case "$(basename "$argv0")" in
	tensorfs*) ;;
	*) fail "$1/lock names pid $pid, which is '$argv0', not tensorfs" ;;
	esac
	echo "$pid"
}

# mount_fg OPTS: like tfs_mount, but with exactly these -o options.
mount_fg() {
	"$TENSORFS" -f -o "$1" "$MNT" >>"$LOG" 2>&1 &
	TFS_PID=$!
	local i
	for i in $(seq 1 200); do
		is_mounted "$MNT" && return 0
		if ! alive "$TFS_PID"; then
			wait "$TFS_PID"
			TFS_PID=""
			fail "tensorfs exited before mounting (-o $1)"
		fi
		sleep 0.05
	done
	fail "tensorfs did not mount within 10 s (-o $1)"
}

fstype() {
	awk -v m="$1" '$2 == m { t = $3 } END { print t }' /proc/mounts
}

OPTS="nvme=$NVME,meta=$META,dram=128M"
head -c 5000000 /dev/urandom >"$T/data"

# 1. Daemon mode. Output goes to a file: a daemon that kept the pipe of a
# $(...) open would hang the test.
timeout 60 "$TENSORFS" -o "$OPTS" "$MNT" >"$T/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "daemon mode: exit status $rc: $(head -c 300 "$T/out")"
is_mounted "$MNT" || fail "daemon mode: parent exited 0 before the mount was live"
pid=$(lock_pid "$META") || exit 1
cp "$T/data" "$MNT/data" && sync "$MNT/data" || fail "daemon mode: cannot write"
cmp -s "$T/data" "$MNT/data" || fail "daemon mode: file reads back wrong"
# 5. Thread priorities, by name: field 19 of /proc/PID/task/TID/stat.
prio=$(for t in /proc/"$pid"/task/*; do
	echo "$(cat "$t/comm") $(awk '{print $19}' "$t/stat")"
done | sort -u | tr '\n' ';')
if [ "$(id -u)" -eq 0 ]; then
	# the I/O threads at -10, the FUSE workers at the niceness the daemon was started with
	for want in "tfs-nvme0 -10" "tfs-flusher -10" "tfs-fuse $(nice)"; do
		[[ ";$prio" == *";$want;"* ]] || fail "thread priorities: want '$want' in: $prio"
	done
	echo "   I/O threads at nice -10, FUSE threads at $(nice)"
fi
fusermount3 -u "$MNT" || fail "daemon mode: fusermount3 -u failed"
wait_gone "$pid" || fail "daemon $pid still running 30 s after fusermount3 -u"

timeout 60 "$TENSORFS" -o "$OPTS" "$MNT" >"$T/out" 2>&1 ||
	fail "daemon mode, second mount: exit status $?: $(head -c 300 "$T/out")"
is_mounted "$MNT" || fail "daemon mode, second mount: not live"
pid=$(lock_pid "$META") || exit 1
cmp -s "$T/data" "$MNT/data" || fail "file written before unmount reads back wrong"
fusermount3 -u "$MNT" || fail "daemon mode: fusermount3 -u failed"
wait_gone "$pid" || fail "daemon $pid still running 30 s after fusermount3 -u"

# 2. mount(8). It runs its helper (mount.fuse3, which runs "tensorfs SOURCE
# MNT -o OPTS,dev,suid" through /bin/sh) without the caller's PATH, so
# `mount -t fuse.tensorfs` finds only an installed tensorfs. The helper is
# therefore run directly with the build folder on PATH, exactly as mount(8)
# would run it; then mount(8) itself runs an fstab line that names the
# binary by path (the TYPE#SOURCE form mount.fuse3 accepts with -t fuse).
command -v mount.fuse3 >/dev/null 2>&1 || fail "mount.fuse3 not found (fuse3 package)"
PATH="$BINDIR:$PATH" timeout 60 mount.fuse3 tensorfs "$MNT" -o "$OPTS" -t fuse.tensorfs \
	>"$T/out" 2>&1 || fail "mount.fuse3 -t fuse.tensorfs: exit status $?: $(head -c 300 "$T/out")"
is_mounted "$MNT" || fail "mount.fuse3 -t fuse.tensorfs: not live"
[ "$(fstype "$MNT")" = fuse.tensorfs ] || fail "mount.fuse3: type is $(fstype "$MNT")"
pid=$(lock_pid "$META") || exit 1
cmp -s "$T/data" "$MNT/data" || fail "mount.fuse3: file reads back wrong"
umount "$MNT" || fail "umount of a mount.fuse3 mount failed"
wait_gone "$pid" || fail "daemon $pid still running 30 s after umount"

echo "$TENSORFS#tensorfs $MNT fuse $OPTS,noauto 0 0" >"$T/fstab"
timeout 60 mount -T "$T/fstab" "$MNT" >"$T/out" 2>&1 ||
	fail "mount from an fstab line: exit status $?: $(head -c 300 "$T/out")"
is_mounted "$MNT" || fail "mount from an fstab line: not live"
pid=$(lock_pid "$META") || exit 1
cmp -s "$T/data" "$MNT/data" || fail "fstab mount: file reads back wrong"
umount "$MNT" || fail "umount of an fstab mount failed"
wait_gone "$pid" || fail "daemon $pid still running 30 s after umount"

# 3. Defaults: nothing but the mount point, XDG_DATA_HOME set.
XDG="$T/xdg"
mkdir -p "$XDG"
pre=""
for d in /var/lib/tensorfs "${HOME:-/nonexistent}/.local/share/tensorfs"; do
	[ -e "$d" ] && pre="$pre $d"
done
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
[[ "$avail_kb" =~ ^[0-9]+$ ]] || fail "cannot read MemAvailable from /proc/meminfo"
avail=$((avail_kb * 1024))
XDG_DATA_HOME="$XDG" timeout 120 "$TENSORFS" "$MNT" >"$T/out" 2>&1 ||
	fail "defaults: exit status $?: $(head -c 300 "$T/out")"
is_mounted "$MNT" || fail "defaults: not live"
[ -d "$XDG/tensorfs" ] || fail "defaults: $XDG/tensorfs was not created"
for d in /var/lib/tensorfs "${HOME:-/nonexistent}/.local/share/tensorfs"; do
	case " $pre " in *" $d "*) continue ;; esac
	[ -e "$d" ] && fail "defaults: created $d although XDG_DATA_HOME was set"
done
pid=$(lock_pid "$XDG/tensorfs/meta") || exit 1
bs=$(tfs_stat_json block_size) || fail "defaults: stats unreadable"
[ "$bs" = 1048576 ] || fail "defaults: block_size $bs, want 1048576"
cap=$(tfs_stat_json tiers dram capacity) || fail "defaults: no dram capacity in stats"
[[ "$cap" =~ ^[0-9]+$ ]] || fail "defaults: dram capacity '$cap' is not a number"
[ "$cap" -ge $((avail / 8)) ] && [ "$cap" -le $((avail / 2)) ] ||
	fail "defaults: dram capacity $cap, MemAvailable was $avail (want about a quarter)"
# Without cuda=on no client maps the arena: it is private memory, in
# transparent huge pages wherever the kernel grants them for madvise. A
# memfd gets them only where shmem_enabled allows, and Debian says never.
thp=$(tfs_stat_json tiers dram thp_bytes) || fail "defaults: no dram thp_bytes in stats"
[[ "$thp" =~ ^[0-9]+$ ]] || fail "defaults: dram thp_bytes '$thp' is not a number"
if grep -qE '\[(always|madvise)\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null; then
	[ "$thp" -gt 0 ] || fail "defaults: no byte of the $cap-byte DRAM arena is in transparent huge pages"
fi
path=$(tfs_stat_json tiers nvme0 path) || fail "defaults: no nvme0 path in stats"
[ "$(realpath "$path")" = "$(realpath "$XDG/tensorfs")" ] ||
	fail "defaults: nvme0 path is $path, want $XDG/tensorfs"
echo hello >"$MNT/hello" && [ "$(cat "$MNT/hello")" = hello ] || fail "defaults: cannot write"
fusermount3 -u "$MNT" || fail "defaults: fusermount3 -u failed"
wait_gone "$pid" || fail "daemon $pid still running 30 s after fusermount3 -u"

# 4. config=FILE, then -o over it. Fresh stores: a store keeps its block size.
mkdir -p "$T/nvme-cfg" "$T/nvme-o"
cat >"$T/tensorfs.ini" <<EOF
; tensorfs test configuration
[tensorfs]
dram = 192M
block = 256K
nvme = $T/nvme-cfg
meta = $T/meta-cfg
EOF
# in_force WHAT DRAM BLOCK NVME META: the mount's dram capacity, block size,
# nvme folder and metadata folder are these.
in_force() {
	[ "$(tfs_stat_json tiers dram capacity)" = "$2" ] ||
		fail "$1: dram capacity $(tfs_stat_json tiers dram capacity), want $2"
	[ "$(tfs_stat_json block_size)" = "$3" ] ||
		fail "$1: block_size $(tfs_stat_json block_size), want $3"
	[ "$(realpath "$(tfs_stat_json tiers nvme0 path)")" = "$4" ] ||
		fail "$1: nvme0 path $(tfs_stat_json tiers nvme0 path), want $4"
	[ -e "$5/lock" ] || fail "$1: meta=$5 not used"
}

mount_fg "config=$T/tensorfs.ini"
in_force config $((192 << 20)) 262144 "$T/nvme-cfg" "$T/meta-cfg"
cp "$T/data" "$MNT/data" && cmp -s "$T/data" "$MNT/data" || fail "config: file reads back wrong"
tfs_umount || fail "config: tensorfs -f exited non-zero after unmount"

mount_fg "config=$T/tensorfs.ini,dram=224M,block=512K,nvme=$T/nvme-o,meta=$T/meta-o"
in_force "-o over config" $((224 << 20)) 524288 "$T/nvme-o" "$T/meta-o"
tfs_umount || fail "-o over config: tensorfs -f exited non-zero after unmount"
exit 0
