#!/bin/bash
# A block whose end is zeros, as a file's last block is past the end of the
# file, moves to and from the nvme tier only up to its last non-zero KiB,
# in 4 KiB of I/O. The counts are exact: nvme0's read_bytes and
# write_bytes must move by the bytes the files hold, rounded so, not by
# whole blocks. And the bytes must stay right where that is easy to get
# wrong: past the old end after a file grows (a write past the end, a
# truncate up), after a truncate down, when the last block is rewritten
# while not cached (whole: no read; in part: the stored bytes are read and
# merged), after a remount and a kill -9, and when dedup's verify compares
# a new block with a short stored one. Every check compares the file with
# a model kept on the local disk, after the file has left DRAM.
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

MB=$((1 << 20))
KB=1024
MODEL="$T/model"
mkdir -p "$MODEL"

nv() { tfs_stat_json tiers nvme0 "$1" || fail "no stats"; }
ctl() { "$TFSCTL" -m "$MNT" "$@" >"$T/ctl.out" 2>&1 || fail "tfsctl $*: $(cat "$T/ctl.out")"; }
io4k() { echo $((($1 + 4095) / 4096 * 4096)); }

# op FILE ARGS...: the same change to the file and to its model, in one call each.
#   write OFF LEN SEED   LEN bytes of random data (last byte never 0) at OFF
#   truncate SIZE
op() {
	python3 - "$MNT/$1" "$MODEL/$1" "${@:2}" <<'PY' || fail "op $*"
import os, random, sys
paths, what, args = sys.argv[1:3], sys.argv[3], [int(a) for a in sys.argv[4:]]
for p in paths:
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    if what == "write":
        off, n, seed = args
        b = bytearray(random.Random(seed).randbytes(n))
        b[-1] = b[-1] or 1
        assert os.pwrite(fd, b, off) == n
    else:
        os.ftruncate(fd, args[0])
    os.close(fd)
PY
}

# same WHAT: every file reads as its model, after leaving DRAM. Reading
# them all loads each file's stored bytes: moved counts them.
same() {
	local f
	for f in "$MODEL"/*; do
		f=${f##*/}
		ctl evict "$MNT/$f"
		# O_DIRECT: from the daemon, not from the kernel's page cache
		dd if="$MNT/$f" of="$T/got" bs=1M iflag=direct status=none || fail "$1: reading $f"
		cmp "$T/got" "$MODEL/$f" >"$T/cmp.out" 2>&1 ||
			fail "$1: $f reads wrong: $(head -c 300 "$T/cmp.out")"
	done
}

# moved WHAT KEY WANT: nvme0's KEY moved by WANT since the last call for KEY.
declare -A LAST
moved() {
	local now d
	now=$(nv "$2")
	d=$((now - ${LAST[$2]:-0}))
	LAST[$2]=$now
	[ "$d" -eq "$3" ] || fail "$1: nvme0 $2 moved by $d bytes, want $3"
	echo "   $1: nvme0 $2 +$d"
}

tfs_mount
LAST[read_bytes]=$(nv read_bytes)
LAST[write_bytes]=$(nv write_bytes)

# 1. Two files with short last blocks: a is 2 MiB and 64 KiB, b 300 KiB
#    and 1 byte (its only block holds 301 KiB, written as 304 KiB).
op a write 0 $((2 * MB + 64 * KB)) 1
op b write 0 $((300 * KB + 1)) 2
ctl flush
moved "write-back" write_bytes $((2 * MB + 64 * KB + $(io4k $((301 * KB)))))
moved "write-back" read_bytes 0

# 2. Loaded back: as many bytes again, and the right ones.
same "loaded back"
moved "loads" read_bytes $((2 * MB + 64 * KB + $(io4k $((301 * KB)))))

# 3. a's last block, not cached, rewritten to its end: nothing to read.
ctl evict "$MNT/a"
op a write $((2 * MB)) $((64 * KB)) 3
ctl flush
moved "whole rewrite of a last block" read_bytes 0
moved "whole rewrite of a last block" write_bytes $((64 * KB))
same "whole rewrite of a last block"
moved "whole rewrite, loaded" read_bytes $((2 * MB + 64 * KB + $(io4k $((301 * KB)))))

# 4. Part of it, not cached: its 64 KiB stored are read once and merged.
ctl evict "$MNT/a"
op a write $((2 * MB + 8 * KB)) $((4 * KB)) 4
ctl flush
moved "part of a last block" read_bytes $((64 * KB))
same "part of a last block"

# 5. Past the end: the bytes between read as zeros, whatever the device
#    slots held before. A write past the end, a truncate down into the
#    last block and one up again, in b's short block and a's.
op b write $((700 * KB + 100)) 10 5
same "a write past the end"
op a truncate $((2 * MB + 5000))
op a truncate $((2 * MB + 512 * KB))
op b truncate 1000
op b truncate $((900 * KB))
same "truncate down, then up"
op a write $((3 * MB + 100)) 10 6
same "a write into a new block past the end"

# 6. Across a remount, then a kill -9 after a flush.
tfs_umount || fail "unmount failed"
tfs_mount
same "after a remount"
op a write $((3 * MB)) $((4 * KB)) 7
op b truncate $((200 * KB + 3))
ctl flush
tfs_kill9
tfs_mount
same "after kill -9"

# 7. dedup=verify (the default) shares a copy of a short stored block only
#    after reading its stored bytes and finding the rest of the new one zeros.
cp "$MODEL/b" "$MODEL/c"
python3 -c 'import shutil,sys; shutil.copyfile(sys.argv[1], sys.argv[2])' "$MODEL/b" "$MNT/c"
hits=$(tfs_stat_json dedup hits) || fail "no stats"
ctl flush
[ "$(tfs_stat_json dedup hits)" -gt "$hits" ] || fail "dedup: the copy of b was not shared"
[ "$(tfs_stat_json dedup verify_mismatches)" -eq 0 ] || fail "dedup: verify found other bytes"
same "a shared short block"

tfs_umount || fail "unmount failed"
"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
echo "PASS: short last blocks"
