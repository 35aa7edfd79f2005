#!/bin/bash
# Slab space comes back (case 12 of issue 37): the slab file kept every
# block it ever held, so after the files of a 2 GiB swap state were all
# deleted the nvme folder still held 2.6 GiB. Space free for a while
# (punch_after_ms, 10 s by default, used here) now goes back to the
# filesystem: a free end is cut off, free runs within are punched, and a
# write into a punched slot allocates it again (tiers/dev_slab.c, dev_engine.c).
#
#   1. Write 2 GiB of random bytes in 8 files and fsync them: the nvme
#      folder holds at least 1.8 GiB (du). Delete them all: within
#      WAIT_S (60 s) the folder holds under 10% of 2 GiB (du), and the
#      stats count the bytes given back.
#   2. Space within the slab: write A, B (128 MiB each), then C (64 MiB);
#      delete A and B. The folder comes down to under 192 MiB (C and the
#      slab's growth step) while C stays where it is, so the space went
#      back by punching. Then write D (256 MiB), into the punched slots
#      and past them; after a remount C and D read back as written, and
#      fsck finds the store clean.
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

MiB=$((1 << 20))
GiB=$((1 << 30))
WAIT_S=60
export TFS_DRAM=256M

folder() { du -sB1 "$NVME" | cut -f1; }

# write FILE MIB: MIB MiB of random bytes, fsynced; prints their md5.
write() {
	python3 - "$1" "$2" <<'PY' || fail "writing $1"
import hashlib, os, sys
h = hashlib.md5()
with open(sys.argv[1], "wb") as f:
    for _ in range(int(sys.argv[2])):
        b = os.urandom(1 << 20)
        h.update(b)
        f.write(b)
    f.flush()
    os.fsync(f.fileno())
print(h.hexdigest())
PY
}

# down_to BYTES: wait until the folder holds less, WAIT_S at most; prints
# the seconds it took.
down_to() {
	local i
	for ((i = 0; i < WAIT_S * 2; i++)); do
		if [ "$(folder)" -lt "$1" ]; then
			echo "$((i / 2))"
			return 0
		fi
		sleep 0.5
	done
	return 1
}

echo "1. 2 GiB written, then deleted"
tfs_mount
for i in $(seq 1 8); do
	write "$MNT/state$i" 256 >/dev/null
done
held=$(folder)
echo "   written: the folder holds $((held / MiB)) MiB"
[ "$held" -ge $((18 * GiB / 10)) ] || fail "the folder holds only $held bytes after 2 GiB fsynced"
rm -f "$MNT"/state*
s=$(down_to $((2 * GiB / 10))) ||
	fail "the folder still holds $(($(folder) / MiB)) MiB $WAIT_S s after 2 GiB were deleted"
echo "   deleted: $(($(folder) / MiB)) MiB after ${s} s; slab file $(stat -c %s "$NVME/tensorfs.slab") bytes"
back=$(tfs_stat_json tiers nvme0 returned_bytes) || fail "no returned_bytes in the stats"
[ "$back" -ge $((18 * GiB / 10)) ] || fail "the stats count $back bytes given back"

echo "2. space within the slab, and writes into it"
write "$MNT/A" 128 >/dev/null
write "$MNT/B" 128 >/dev/null
c=$(write "$MNT/C" 64)
rm -f "$MNT/A" "$MNT/B"
s=$(down_to $((192 * MiB))) ||
	fail "the folder holds $(($(folder) / MiB)) MiB $WAIT_S s after A and B were deleted"
end=$(stat -c %s "$NVME/tensorfs.slab")
echo "   A, B deleted: $(($(folder) / MiB)) MiB after ${s} s; slab file $((end / MiB)) MiB long"
[ "$end" -ge $((256 * MiB)) ] || fail "the slab was cut to $end bytes under C's blocks"
d=$(write "$MNT/D" 256)
tfs_umount || fail "unmount"
tfs_mount
[ "$(md5sum <"$MNT/C" | cut -d' ' -f1)" = "$c" ] || fail "C reads back wrong after the punches"
[ "$(md5sum <"$MNT/D" | cut -d' ' -f1)" = "$d" ] || fail "D, written into punched slots, reads back wrong"
tfs_umount || fail "unmount"
"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || {
	cat "$T/fsck.out" >&2
	fail "fsck after the punches"
}
echo "PASS"
