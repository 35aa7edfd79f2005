#!/bin/bash
# Device folders and the store's blocks on them (issue 37, case 2).
#
# A store on nvme=A:B holds every other block of a file on B. When B's
# drive did not mount, B is an empty folder: a mount that took it as a new
# device served zeros for those blocks, fsynced or not, and wrote new ones
# into the wrong disk. Each folder's tensorfs.dev binds it to the store, its
# place in the list and a binding id that the store records; the store
# counts its blocks on each device when it mounts. Checked here:
#   1. B emptied (mv B B.real; mkdir B): the mount is refused, naming B and
#      the blocks the store holds there, and B is left empty; with B.real
#      back in place the file reads back whole.
#   2. A new empty folder C at the end, where the store has no blocks, is
#      taken as a new device: it gets tensorfs.dev and takes blocks.
#   3. C emptied while the store holds no block on it is taken afresh
#      (a new binding); once blocks went there, the old C put back is
#      refused as an earlier binding, and the new one mounts.
#   4. A folder with tensorfs.slab but no tensorfs.dev is refused, and left
#      as it was.
#   5. B with its tensorfs.dev but without its slab is refused while the
#      store holds blocks there; nothing is left made in B.
#   6. The folders swapped (nvme=B:A) are refused.
#   7. An empty meta folder (its drive not mounted) with the nvme folders
#      of a store: refused, naming the folder; nothing made in it.
# Every refusal is a non-zero exit with a message, never a signal.

. "$(dirname "$0")/lib.sh"

MB=$((1 << 20))
A="$T/A"
B="$T/B"
C="$T/C"
mkdir -p "$A" "$B"
export TFS_DRAM=128M TFS_THREADS=4

opts() { echo "nvme=$1,meta=$META,dram=128M,threads=4"; }

# refused NVME PATTERN WHAT: the mount on nvme=NVME is refused with PATTERN in the log.
refused() {
	local rc=0
	: >"$LOG"
	tfs_start "$(opts "$1")" || rc=$?
	if [ $rc -eq 0 ]; then
		tfs_umount
		fail "$3: the mount was not refused"
	fi
	[ $rc -lt 128 ] || fail "$3: the daemon died by signal $((rc - 128))"
	grep -qE -e "$2" "$LOG" || fail "$3: the refusal does not say '$2': $(cat "$LOG")"
	echo "ok: $3"
}

# --- 1. the drive of B did not mount ----------------------------------------
tfs_start "$(opts "$A:$B")" || fail "cannot make the store on A:B"
head -c $((16 * MB)) /dev/urandom >"$T/f.ref"
cp "$T/f.ref" "$MNT/f" && sync "$MNT/f" || fail "cannot write f"
tfs_umount || fail "unmount of A:B"
mv "$B" "$B.real"
mkdir -m700 "$B"
refused "$A:$B" "nvme folder $B has no tensorfs\.dev, but this store holds [0-9]+ blocks on it \(device 1\)" \
	"1: B emptied"
[ -z "$(ls -A "$B")" ] || fail "1: the refused mount left $(ls -A "$B") in B"
rmdir "$B"
mv "$B.real" "$B"
tfs_start "$(opts "$A:$B")" || fail "1: the mount with B back failed"
cmp -s "$T/f.ref" "$MNT/f" || fail "1: f does not read back whole with B back"

# --- 2. a new empty folder at the end ----------------------------------------
tfs_umount || fail "unmount"
grep -q " bind=" "$B/tensorfs.dev" || fail "B/tensorfs.dev names no binding: $(cat "$B/tensorfs.dev")"
mkdir -m700 "$C"
tfs_start "$(opts "$A:$B:$C")" || fail "2: a new empty folder C at the end was refused: $(cat "$LOG")"
grep -q "index=2 kind=nvme bind=" "$C/tensorfs.dev" || fail "2: C/tensorfs.dev: $(cat "$C/tensorfs.dev")"
head -c $((64 * MB)) /dev/urandom >"$T/g.ref"
cp "$T/g.ref" "$MNT/g" && sync "$MNT/g" || fail "2: cannot write g"
[ "$(tfs_stat_json tiers nvme2 used)" -gt 0 ] || fail "2: no block went to C"
cmp -s "$T/f.ref" "$MNT/f" || fail "2: f reads back wrong"
echo "ok: 2: a new empty folder at the end"

# --- 3. C emptied, with no blocks and then with blocks ------------------------
rm "$MNT/g"
tfs_umount || fail "unmount"
mv "$C" "$C.old"
mkdir -m700 "$C"
tfs_start "$(opts "$A:$B:$C")" || fail "3: C emptied while the store held no block there was refused"
cp "$T/g.ref" "$MNT/g" && sync "$MNT/g" || fail "3: cannot write g"
[ "$(tfs_stat_json tiers nvme2 used)" -gt 0 ] || fail "3: no block went to the new C"
tfs_umount || fail "unmount"
mv "$C" "$C.new"
mv "$C.old" "$C"
refused "$A:$B:$C" "nvme folder $C holds an earlier binding of device 2 of this store" "3: the old C back"
rm -rf "$C"
mv "$C.new" "$C"
tfs_start "$(opts "$A:$B:$C")" || fail "3: the new C back was refused"
cmp -s "$T/g.ref" "$MNT/g" || fail "3: g reads back wrong"
tfs_umount || fail "unmount"

# --- 4. a slab without an identity -------------------------------------------
mkdir -m700 "$T/D"
cp "$B/tensorfs.slab" "$T/D/"
refused "$A:$B:$C:$T/D" "nvme folder $T/D holds tensorfs\.slab but no tensorfs\.dev" "4: slab, no identity"
[ "$(ls -A "$T/D")" = tensorfs.slab ] || fail "4: the refused mount changed D: $(ls -A "$T/D")"
cmp -s "$B/tensorfs.slab" "$T/D/tensorfs.slab" || fail "4: the refused mount changed D's slab"

# --- 5. an identity without its slab -----------------------------------------
mv "$B/tensorfs.slab" "$T/B.slab"
refused "$A:$B:$C" "nvme folder $B holds this store's tensorfs\.dev but no tensorfs\.slab" \
	"5: identity, no slab"
[ "$(ls -A "$B")" = tensorfs.dev ] || fail "5: the refused mount left $(ls -A "$B") in B"
mv "$T/B.slab" "$B/tensorfs.slab"

# --- 6. the folders swapped ---------------------------------------------------
refused "$B:$A:$C" "nvme folder $B was device 1 of this store but is now 0" "6: folders swapped"

# --- 7. the meta folder's drive did not mount ---------------------------------
mv "$META" "$META.real"
mkdir -m700 "$META"
refused "$A:$B:$C" "nvme folder $A holds tensorfs\.dev of store [0-9a-f-]+ but meta folder $META holds no store" \
	"7: meta folder emptied"
[ -z "$(ls -A "$META")" ] || fail "7: the refused mount left $(ls -A "$META") in the meta folder"
rmdir "$META"
mv "$META.real" "$META"

# All of it put back: every file whole, and fsck clean.
tfs_start "$(opts "$A:$B:$C")" || fail "the store put back does not mount: $(cat "$LOG")"
cmp -s "$T/f.ref" "$MNT/f" || fail "f reads back wrong at the end"
cmp -s "$T/g.ref" "$MNT/g" || fail "g reads back wrong at the end"
tfs_umount || fail "last unmount"
if [ -n "${TFSCTL:-}" ]; then
	"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
fi
echo "PASS"
exit 0
