#!/bin/bash
# Mount test of the GPU path, without a GPU: the shared-arena protocol and
# libtensorfs-cuda's logic, with memcpy standing in for cudaMemcpyAsync
# (gpuproto, linked with cuda/copy_cpu.c).
#
# 1. cuda=on, 64K blocks and a 16M DRAM tier, so that one call takes many
#    batches and reads load blocks from nvme: the daemon says once whether
#    it pinned the arena with CUDA; the socket is private to the owner; the
#    protocol cases, random round trips (one and four threads), a client
#    killed while holding pins, and a client of another uid all behave;
#    a copy failing midway leaves no pin and no byte changed outside a
#    failed write's range; fds sent in any shape leave the daemon holding
#    none; a GRANT proves only what the fd's open mode proves; a truncate
#    under a held write pin can be killed and gives up with ETXTBSY within
#    a bound; a refused client reads why; unmount removes the socket.
# 2. What went through the arena survives a remount, and a process that
#    used the arena before goes on using it after. A file four times the
#    DRAM tier, written through the arena, reads back exact after a
#    remount, from nvme (the stats say so), asking the daemon to load
#    ahead of its pins.
# 3. cuda=off: no socket; the same calls take pread/pwrite and round trip
#    exactly; so do calls on a file of another filesystem. The fallback's
#    double buffering, O_DIRECT middles, unaligned edges, EOF and short
#    writes, on the mount and on the local disk (where O_DIRECT must be
#    used).
# 4. cuda = on from a config file, 1M blocks, data resident in DRAM.
# 5. cuda=maybe is refused, naming the option.
# 6. Pinned blocks are not the flusher's reserve: with read pins holding
#    every clean block and the rest dirty under its mark, it cleans others
#    and a write to a new block goes through (no age limit on that mount);
#    a write pin held on the oldest dirty block does not keep the blocks
#    behind it from the age limit.
# 7. The socket's folder is the daemon's own, beyond other users' reach
#    (root only: another user plays the attacker). An XDG_RUNTIME_DIR of
#    another user (nobody), or below a folder of theirs, is passed over
#    with a warning, and the socket goes where no other user can change
#    the folder or any folder above it; one of root's own is used. A
#    socket that nobody plants in place of the daemon's receives no
#    request and no fd from a root client (SO_PEERCRED against the
#    mount's owner), whose calls fall back to pread/pwrite. (Regression:
#    the socket was made in any XDG_RUNTIME_DIR, and the client handed
#    whoever listened there the fds of root's files.)
# 8. A daemon killed with -9 leaves its socket's folder behind; the next
#    daemon with cuda=on removes it (one of ours, 0700, a minute old, its
#    socket unanswered), and leaves a folder whose socket a process still
#    listens on, a young one and one open to others. (Regression: each
#    killed daemon left a tensorfs-gpu-* folder for good.)

. "$(dirname "$0")/../mount/lib.sh"

: "${GPUPROTO:?GPUPROTO must name the gpuproto test program}"
command -v python3 >/dev/null 2>&1 || skip "python3 not found"

# gpu_json KEY: a value of /.tensorfs/gpu (None for null)
gpu_json() {
	python3 - "$MNT/.tensorfs/gpu" "$1" <<'PY'
import json, sys
print(json.load(open(sys.argv[1])).get(sys.argv[2]))
PY
}

GP_PID=""
tfs_extra_cleanup() {
	[ -n "$GP_PID" ] && kill "$GP_PID" 2>/dev/null
	true
}

sums() {
	(cd "$MNT" && md5sum rt0 rt1 rt2 rt3 p-data c-write)
}

# 1.
TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K"
n=$(grep -c -E "cuda=on: (no GPU|.*pinned for DMA by CUDA|cannot)" "$LOG")
[ "$n" -eq 1 ] || fail "the daemon should say once what became of CUDA, said it $n times"
[ "$(gpu_json enabled)" = True ] || fail "gpu file: not enabled with cuda=on"
sock=$(gpu_json socket)
[ -S "$sock" ] || fail "gpu file names $sock, which is not a socket"
[ "$(stat -c %a "$(dirname "$sock")")" = 700 ] || fail "the socket's folder is not private"
[ "$(stat -c %a "$sock")" = 600 ] || fail "the socket is not private"
[ "$(gpu_json block_size)" = 65536 ] || fail "gpu file: block_size $(gpu_json block_size)"
"$GPUPROTO" protocol "$MNT" || fail "protocol cases"
"$GPUPROTO" roundtrip "$MNT" zerocopy 300 1 || fail "round trips through the arena"
"$GPUPROTO" roundtrip "$MNT" zerocopy 120 4 || fail "round trips, four threads"
"$GPUPROTO" crash "$MNT" || fail "a client killed while holding pins"
"$GPUPROTO" copyfail "$MNT" zerocopy || fail "a copy failing midway"
"$GPUPROTO" owner "$MNT"
rc=$?
[ $rc -eq 0 ] || [ $rc -eq 77 ] || fail "a client of another uid"
"$GPUPROTO" fdleak "$MNT" "$TFS_PID" || fail "the daemon keeps fds that clients sent"
"$GPUPROTO" grantmode "$MNT" || fail "a GRANT proves more than the fd's open mode"
"$GPUPROTO" pinwait "$MNT" || fail "a truncate under a client's write pin"
"$GPUPROTO" refuse "$MNT"
rc=$?
[ $rc -eq 0 ] || [ $rc -eq 77 ] || fail "a refused client does not read why"
before=$(sums) || fail "md5sum"
"$GPUPROTO" remount "$MNT" "$T/ready" "$T/go" &
GP_PID=$!
for i in $(seq 1 600); do
	[ -e "$T/ready" ] || ! kill -0 $GP_PID 2>/dev/null && break
	sleep 0.05
done
[ -e "$T/ready" ] || fail "gpuproto remount did not get ready"
tfs_umount || fail "unmount after the arena tests"
[ ! -e "$sock" ] && [ ! -e "$(dirname "$sock")" ] || fail "the socket outlived the mount"

# 2.
TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K"
touch "$T/go"
wait $GP_PID || fail "a process that used the arena, across a remount"
GP_PID=""
[ "$(sums)" = "$before" ] || fail "files written through the arena changed across a remount"
"$GPUPROTO" nvme "$MNT" write 64 || fail "a file larger than DRAM written through the arena"
tfs_umount || fail "unmount after the remount"
TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K"
nv0=$(tfs_stat_json tiers nvme0 read_bytes) || fail "stats"
"$GPUPROTO" nvme "$MNT" read 64 || fail "a file larger than DRAM read back through the arena"
nv1=$(tfs_stat_json tiers nvme0 read_bytes) || fail "stats"
[ $((nv1 - nv0)) -ge $((64 << 20)) ] ||
	fail "reading 64M from nvme read only $((nv1 - nv0)) bytes of nvme0"
tfs_umount || fail "unmount after the nvme read"

# 3.
TFS_DRAM=16M TFS_THREADS=4 tfs_mount "block=64K"
[ "$(sums)" = "$before" ] || fail "files written through the arena changed across a remount"
[ "$(gpu_json enabled)" = False ] && [ "$(gpu_json socket)" = None ] ||
	fail "cuda=off still publishes a socket"
"$GPUPROTO" roundtrip "$MNT" fallback 150 2 || fail "round trips through pread/pwrite"
"$GPUPROTO" copyfail "$MNT" fallback || fail "a copy failing midway, fallback"
"$GPUPROTO" fallback "$MNT" any || fail "the fallback's edges, EOF and short writes on the mount"
mkdir -p "$T/plain"
"$GPUPROTO" roundtrip "$T/plain" fallback 60 1 || fail "round trips on another filesystem"
"$GPUPROTO" fallback "$T/plain" direct || fail "the fallback's edges, EOF and short writes on disk"
tfs_umount || fail "unmount of the cuda=off mount"

# 4.
rm -rf "$NVME" "$META"
mkdir -p "$NVME"
printf '[tensorfs]\ncuda = on\n' >"$T/tensorfs.conf"
TFS_DRAM=256M TFS_THREADS=8 tfs_mount "config=$T/tensorfs.conf"
python3 - "$MNT/.tensorfs/config" <<'PY' || fail "config: cuda is not on"
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))["cuda"] is True else 1)
PY
[ -S "$(gpu_json socket)" ] || fail "cuda = on from the config file serves no socket"
"$GPUPROTO" roundtrip "$MNT" zerocopy 80 2 || fail "round trips with 1M blocks"
tfs_umount || fail "unmount of the config-file mount"

# 5.
if "$TENSORFS" -f -o "nvme=$NVME,meta=$META,dram=64M,threads=4,cuda=maybe" "$MNT" \
	>"$T/bad.log" 2>&1; then
	fail "cuda=maybe was accepted"
fi
grep -q "cuda" "$T/bad.log" || fail "the refusal of cuda=maybe does not name the option"

# 6.
rm -rf "$NVME" "$META"
mkdir -p "$NVME"
TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K,dirty_expire_ms=0"
"$GPUPROTO" starve "$MNT" reserve || fail "a write with every unpinned slot dirty"
tfs_umount || fail "unmount after the reserve case"
TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K,dirty_expire_ms=1000"
"$GPUPROTO" starve "$MNT" expire || fail "the age limit behind a held write pin"
tfs_umount || fail "unmount after the age limit case"

# 7.
# private_dir DIR: DIR is root's and 0700, and every folder above it is
# root's and writable by no one else unless sticky.
private_dir() {
	local d=$1
	[ "$(stat -c '%u %a' "$d")" = "0 700" ] || return 1
	while [ "$d" != / ]; do
		d=$(dirname "$d")
		[ "$(stat -c %u "$d")" = 0 ] || return 1
		[ -z "$(find "$d" -maxdepth 0 -perm /022 ! -perm -1000)" ] || return 1
	done
}
if [ "$(id -u)" = 0 ]; then
	rm -rf "$NVME" "$META"
	mkdir -p "$NVME"
	chmod 755 "$T"
	mkdir -m 700 "$T/xdg-nobody"
	chown 65534:65534 "$T/xdg-nobody"
	mkdir -m 755 "$T/nobodys" && chown 65534:65534 "$T/nobodys"
	mkdir -m 700 "$T/nobodys/run"
	mkdir -m 755 "$T/xdg-root"
	for xdg in "$T/xdg-nobody" "$T/nobodys/run"; do
		: >"$LOG"
		XDG_RUNTIME_DIR=$xdg TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K"
		sock=$(gpu_json socket)
		[ -S "$sock" ] || fail "XDG_RUNTIME_DIR=$xdg: the gpu file names $sock, not a socket"
		case $sock in "$T"/*) fail "XDG_RUNTIME_DIR=$xdg of another user: the socket is $sock" ;; esac
		private_dir "$(dirname "$sock")" ||
			fail "XDG_RUNTIME_DIR=$xdg: the socket's folder, or one above it, is not root's alone: $sock"
		grep -qF "XDG_RUNTIME_DIR=$xdg is not used for the GPU socket" "$LOG" ||
			fail "no warning that XDG_RUNTIME_DIR=$xdg was passed over"
		"$GPUPROTO" roundtrip "$MNT" zerocopy 20 1 || fail "round trips, the socket in $(dirname "$sock")"
		tfs_umount || fail "unmount, XDG_RUNTIME_DIR=$xdg"
		echo "XDG_RUNTIME_DIR=$xdg passed over: the socket was $sock"
	done
	XDG_RUNTIME_DIR=$T/xdg-root TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K"
	sock=$(gpu_json socket)
	[ "$(dirname "$(dirname "$sock")")" = "$T/xdg-root" ] ||
		fail "an XDG_RUNTIME_DIR of root's own was not used: the socket is $sock"
	"$GPUPROTO" hijack "$MNT" || fail "a socket planted by another uid"
	tfs_umount || fail "unmount after the planted socket"
fi

# 8.
X=$T/xdg8
mkdir -m 700 "$X"
rm -rf "$NVME" "$META"
mkdir -p "$NVME"
XDG_RUNTIME_DIR=$X TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K"
dead=$(dirname "$(gpu_json socket)")
[ "$(dirname "$dead")" = "$X" ] || fail "part 8: the socket is not in XDG_RUNTIME_DIR: $dead"
tfs_kill9
[ -d "$dead" ] || fail "part 8: a daemon killed with -9 removed its socket's folder"
mkdir -m 700 "$X/tensorfs-gpu-live" "$X/tensorfs-gpu-young"
mkdir -m 755 "$X/tensorfs-gpu-open"
python3 - "$X/tensorfs-gpu-live/sock" "$T/listening" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1])
s.listen(4)
open(sys.argv[2], "w").close()
time.sleep(120)
PY
GP_PID=$!
for i in $(seq 1 100); do [ -e "$T/listening" ] && break; sleep 0.1; done
[ -e "$T/listening" ] || fail "part 8: the listener did not start"
touch -d '2 minutes ago' "$dead" "$X/tensorfs-gpu-live" "$X/tensorfs-gpu-open"
: >"$LOG"
XDG_RUNTIME_DIR=$X TFS_DRAM=16M TFS_THREADS=4 tfs_mount "cuda=on,block=64K"
[ ! -e "$dead" ] || fail "part 8: the killed daemon's folder $dead is still there"
for k in live young open; do
	[ -d "$X/tensorfs-gpu-$k" ] || fail "part 8: the $k folder was removed"
done
[ -S "$X/tensorfs-gpu-live/sock" ] || fail "part 8: the listening socket was removed"
grep -qF "removed 1 GPU socket folder(s) that killed daemons left in $X" "$LOG" ||
	fail "part 8: the log does not say what was removed"
"$GPUPROTO" roundtrip "$MNT" zerocopy 20 1 || fail "part 8: round trips after the clean-up"
tfs_umount || fail "part 8: unmount"
kill "$GP_PID" 2>/dev/null
wait "$GP_PID" 2>/dev/null
GP_PID=""
echo "part 8: the killed daemon's socket folder was removed; a live, a young and an open one kept"
echo "PASS"
