#!/bin/bash
# End-to-end checksums: every block read from a device is checked against
# the hash its record keeps since write-back, and is never served when the
# two differ (docs/security.md). Damage is done to the slab file while the
# store is unmounted, as bit rot or a bad drive would:
#   1. files a (8 MiB), b (3 MiB + 5000 bytes: its last block is stored
#      short, as far as its last non-zero KiB) and c (8 MiB), written and
#      fsynced; remounted, every block reads back right;
#   2. unmounted: the slot of a's block 2 zeroed (1 MiB), one byte flipped
#      in a's block 5 and in b's short last block; remounted, each damaged
#      block reads EIO, every other block of every file reads right, a log
#      line names each damaged block (inode and block index), the counters
#      (stats, tfsctl stats, metrics) count them, and tfsctl scrub
#      lists exactly those three, by path and block, with exit status 1;
#   3. a new file with the bytes a's block 2 had: dedup's verify read finds
#      the stored copy damaged, stores the new one and enters it in the
#      index, so that a third copy shares it;
#   4. a write of one KiB into a's damaged block 5, not cached: the read
#      that completes the block from its stored copy is checked too (EIO);
#   5. the slab truncated in c's last block: it and every block stored past
#      it read EIO, and scrub lists them as failed reads;
#   6. dedup=off keeps the hash too: a flipped byte is found the same way;
#   7. checksum=off: reads are not checked (counted unverified), and scrub
#      still finds the damaged block.
# On 2582941 the damaged blocks read back with their wrong bytes and rc 0.
. "$(dirname "$0")/lib.sh"

: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
MB=$((1 << 20))
SLAB="$NVME/tensorfs.slab"
head -c $((8 * MB)) /dev/urandom >"$T/a" || fail "cannot make source data"
head -c $((3 * MB + 5000)) /dev/urandom >"$T/b"
head -c $((8 * MB)) /dev/urandom >"$T/c"

stat_val() { tfs_stat_json "$@" || fail "stats unreadable"; }

# slots NAME...: "NAME IDX SLOT" for each block of each file, found by
# comparing the slab's first 64 slots (a new store's blocks are there) with
# the source files' blocks (zeros past a file's end, as a short block is
# stored).
slots() {
	python3 - "$SLAB" "$T" "$@" <<'PY'
import hashlib, sys
slab, tdir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
bs = 1 << 20
want = {}
for n in names:
    data = open(f"{tdir}/{n}", "rb").read()
    for i in range(0, len(data), bs):
        blk = data[i:i + bs].ljust(bs, b"\0")
        want[hashlib.sha256(blk).digest()] = (n, i // bs)
with open(slab, "rb") as f:
    slot = 0
    while slot < 64:
        blk = f.read(bs)
        if not blk:
            break
        hit = want.get(hashlib.sha256(blk.ljust(bs, b"\0")).digest())
        if hit:
            print(hit[0], hit[1], slot)
        slot += 1
PY
}

# slot_of NAME IDX: the slot that holds block IDX of NAME (from $T/map).
slot_of() {
	awk -v n="$1" -v i="$2" '$1 == n && $2 == i { print $3 }' "$T/map"
}

# flip SLOT OFFSET: invert one byte of the slab at SLOT's OFFSET.
flip() {
	flip_byte "$SLAB" $(($1 * MB + $2))
}

# expect_eio WANT GOT: the blocks that read EIO are exactly those of WANT.
expect_eio() {
	[ "$(sort -u "$1")" = "$(sort -u "$2")" ] ||
		fail "blocks that read EIO: $(tr '\n' ' ' <"$2"); want $(tr '\n' ' ' <"$1")"
}

# 1. Written, remounted: all of it reads back right, the short block too.
tfs_mount
for f in a b c; do
	dd if="$T/$f" of="$MNT/$f" bs=1M conv=fsync status=none || fail "write $f"
done
tfs_umount || fail "unmount"
slots a b c >"$T/map"
[ "$(wc -l <"$T/map")" -eq 20 ] || fail "found $(wc -l <"$T/map") of the 20 blocks in the slab"
tfs_mount
readcheck a b c >"$T/eio"
[ ! -s "$T/eio" ] || fail "good blocks read EIO: $(tr '\n' ' ' <"$T/eio")"
# (the counters are checked after the damage below: it tells more first)
verified=$(tfs_stat_json checksum verified 2>/dev/null || echo none)
errors=$(tfs_stat_json checksum errors 2>/dev/null || echo none)
ino_a=$(stat -c %i "$MNT/a") ino_b=$(stat -c %i "$MNT/b")
tfs_umount || fail "unmount"

# 2. Damage three blocks: zeros over a whole one, a byte in another, a byte
#    in the stored part of a short one.
dd if=/dev/zero of="$SLAB" bs=1M seek="$(slot_of a 2)" count=1 conv=notrunc status=none ||
	fail "cannot zero a slot"
flip "$(slot_of a 5)" 12345
flip "$(slot_of b 3)" 4999
printf 'a 2\na 5\nb 3\n' >"$T/want"
tfs_mount
readcheck a b c >"$T/eio"
expect_eio "$T/want" "$T/eio"
[ "$verified" -ge 20 ] 2>/dev/null || fail "good blocks were read unchecked ($verified checked)"
[ "$errors" -eq 0 ] 2>/dev/null || fail "good blocks counted as checksum errors ($errors)"
for blk in "$ino_a 2" "$ino_a 5" "$ino_b 3"; do
	grep -q "checksum mismatch: inode ${blk% *} block ${blk#* }," "$LOG" ||
		fail "no log line names inode ${blk% *} block ${blk#* }"
done
[ "$(stat_val checksum errors)" -ge 3 ] || fail "checksum errors: $(stat_val checksum errors)"
[ "$(stat_val tiers nvme0 checksum_errors)" -ge 3 ] || fail "nvme0's checksum errors not counted"
"$TFSCTL" -m "$MNT" stats >"$T/stats.txt" || fail "tfsctl stats"
grep -Eq '^checksum +verified [0-9]+, unverified [0-9]+, errors ([3-9]|[1-9][0-9]+)\b' "$T/stats.txt" ||
	fail "tfsctl stats does not tell: $(grep checksum "$T/stats.txt")"
grep -Eq '^tensorfs_checksum_errors_total\{mount="[^"]*"\} [1-9]' "$MNT/.tensorfs/metrics" ||
	fail "metrics lack the checksum errors"
rc=0
"$TFSCTL" -m "$MNT" scrub >"$T/scrub.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat "$T/scrub.txt" >&2; fail "scrub exited $rc with damaged blocks, want 1"; }
for blk in "/a block 2" "/a block 5" "/b block 3"; do
	grep -q "^$blk: checksum mismatch (nvme0 slot " "$T/scrub.txt" ||
		{ cat "$T/scrub.txt" >&2; fail "scrub does not list $blk"; }
done
[ "$(grep -c 'checksum mismatch' "$T/scrub.txt")" -eq 3 ] ||
	{ cat "$T/scrub.txt" >&2; fail "scrub lists other blocks than the three damaged"; }
grep -q '^scrub: 20 blocks checked (0 without a hash) in .* 3 damaged$' "$T/scrub.txt" ||
	{ cat "$T/scrub.txt" >&2; fail "scrub's summary"; }

# 3. A copy of a's block 2 as it was: dedup's verify finds the stored copy
#    damaged; the new block takes its place in the index.
dd if="$T/a" of="$T/a2" bs=1M skip=2 count=1 status=none
dd if="$T/a2" of="$MNT/copy1" bs=1M conv=fsync status=none || fail "write copy1"
h0=$(stat_val dedup hits) m0=$(stat_val dedup verify_mismatches)
dd if="$T/a2" of="$MNT/copy2" bs=1M conv=fsync status=none || fail "write copy2"
[ "$(stat_val dedup hits)" -eq $((h0 + 1)) ] ||
	fail "a copy of a damaged block's bytes does not share the good copy stored since"
[ "$(stat_val dedup verify_mismatches)" -eq "$m0" ] ||
	fail "dedup compared with the damaged copy again"
cmp -s "$T/a2" "$MNT/copy1" && cmp -s "$T/a2" "$MNT/copy2" || fail "the copies read back wrong"

# 4. One KiB written into a's block 5, which is damaged and not cached:
#    completing the block from its stored copy checks that copy.
dd if=/dev/urandom of="$MNT/a" bs=1k seek=$((5 * 1024 + 4)) count=1 conv=notrunc status=none ||
	fail "a sector-aligned write into a's block 5"
dd if="$MNT/a" of=/dev/null bs=4k skip=$((5 * 256)) count=1 status=none 2>"$T/dd.err" &&
	fail "a's block 5, completed from its damaged copy, read back with no error"
grep -q 'Input/output error' "$T/dd.err" || fail "a's block 5: $(cat "$T/dd.err"), want EIO"
rm -f "$MNT/a" # its dirty block cannot be completed: drop it, not written back
tfs_umount || fail "unmount"

# 5. The slab truncated in the middle of c's last block: it, and every
#    block stored past it, read EIO; scrub tells them as failed reads.
cut=$(slot_of c 7)
awk -v s="$cut" '$1 != "a" && $3 >= s { print $1, $2 }' "$T/map" >"$T/want"
echo "b 3" >>"$T/want"
truncate -s $((cut * MB + MB / 2)) "$SLAB"
tfs_mount
readcheck b c >"$T/eio"
expect_eio "$T/want" "$T/eio"
rc=0
"$TFSCTL" -m "$MNT" scrub >"$T/scrub.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat "$T/scrub.txt" >&2; fail "scrub exited $rc after the truncation, want 1"; }
grep -q "^/c block 7: read failed: Input/output error (nvme0 slot $cut)$" "$T/scrub.txt" ||
	{ cat "$T/scrub.txt" >&2; fail "scrub does not list c's block 7 as a failed read"; }
tfs_umount || fail "unmount"

# 6. dedup=off: the hash is kept all the same.
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
tfs_mount dedup=off
dd if="$T/c" of="$MNT/c" bs=1M conv=fsync status=none || fail "write c (dedup=off)"
tfs_umount || fail "unmount"
slots c >"$T/map"
flip "$(slot_of c 6)" 0
echo "c 6" >"$T/want"
tfs_mount dedup=off
readcheck c >"$T/eio"
expect_eio "$T/want" "$T/eio"
tfs_umount || fail "unmount"

# 7. checksum=off: the reads go unchecked; scrub checks all the same.
tfs_mount dedup=off,checksum=off
cat "$MNT/c" >/dev/null || fail "checksum=off: a read failed"
[ "$(stat_val checksum verified)" -eq 0 ] || fail "checksum=off: reads were checked"
[ "$(stat_val checksum unverified)" -ge 8 ] || fail "checksum=off: unchecked reads not counted"
rc=0
"$TFSCTL" -m "$MNT" scrub >"$T/scrub.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "^/c block 6: checksum mismatch" "$T/scrub.txt" ||
	{ cat "$T/scrub.txt" >&2; fail "checksum=off: scrub does not find c's block 6"; }
tfs_umount || fail "unmount"
echo "PASS: checksum"
