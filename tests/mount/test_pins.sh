#!/bin/bash
# Pins persist: a file pinned with tfsctl pin is pinned again at the next
# mount and loaded in the background, stays resident while other files
# stream through a small DRAM tier, and tfsctl pins lists it. unpin and
# evict forget the pin, at this mount and the next; so does rm. A pin
# survives a kill -9 straight after the command returns. A pin that no
# longer fits (a smaller dram= at the next mount) is listed as not active,
# and the mount goes on. Only the mount's owner or root may list pins.
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
chmod 755 "$T" # so that another user can reach the mount point

MB=$((1 << 20))
OPTS="readahead=0,prefetch=off,allow_other"
export TFS_DRAM=64M TFS_THREADS=4

tc() {
	"$TFSCTL" -m "$MNT" "$@" >"$T/tc.out" 2>&1 || fail "tfsctl $*: $(cat "$T/tc.out")"
}
dram_bytes() { # bytes of PATH resident in DRAM
	tc where --json "$1"
	python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tiers"]["dram"])' "$T/tc.out"
}
# pinned: the paths tfsctl pins lists, with ":inactive" after those not pinned now.
pinned() {
	tc pins --json
	python3 -c '
import json, sys
for p in json.load(open(sys.argv[1]))["pins"]:
    print(p["path"] + ("" if p["active"] else ":inactive"))' "$T/tc.out" | sort | tr '\n' ' '
}
want_pins() {
	local got
	got=$(pinned)
	[ "$got" = "$1" ] || fail "$2: tfsctl pins lists '$got', want '$1'"
}
# resident_within PATH BYTES: PATH becomes BYTES resident within 10 s.
resident_within() {
	local i
	for i in $(seq 1 100); do
		[ "$(dram_bytes "$1")" -eq "$2" ] && return 0
		sleep 0.1
	done
	fail "$1: $(dram_bytes "$1") bytes resident after 10 s, want $2"
}
stream() { # read the big files, which do not fit in DRAM together
	local i
	for i in 1 2 3 4; do cat "$MNT/s$i" >/dev/null || fail "reading s$i"; done
}
remount() {
	tfs_umount || fail "unmount"
	tfs_mount "${1:-$OPTS}"
}

tfs_mount "$OPTS"
mkdir "$MNT/keep"
head -c $((16 * MB)) /dev/urandom >"$T/p.ref"
cp "$T/p.ref" "$MNT/keep/p"
head -c $((8 * MB)) /dev/urandom >"$MNT/keep/q"
for i in 1 2 3 4; do
	dd if=/dev/urandom of="$MNT/s$i" bs=1M count=32 status=none || fail "writing s$i"
done
tc flush
tc pins
grep -qx 'no file is pinned' "$T/tc.out" || fail "pins before any pin: $(cat "$T/tc.out")"

tc pin "$MNT/keep"
want_pins "/keep/p /keep/q " "after pin"
tc pins
grep -qE '^/keep/p +16\.0M +16\.0M +16\.0M$' "$T/tc.out" || fail "pins table: $(cat "$T/tc.out")"

# The next mount pins them again and loads them without a read.
remount
resident_within "$MNT/keep/p" $((16 * MB))
resident_within "$MNT/keep/q" $((8 * MB))
want_pins "/keep/p /keep/q " "after a remount"
stream
[ "$(dram_bytes "$MNT/keep/p")" -eq $((16 * MB)) ] || fail "pinned p was evicted by the stream"
cmp -s "$T/p.ref" "$MNT/keep/p" || fail "p reads back wrong"
grep -q '2 pinned files pinned again' "$LOG" || fail "the log does not say the pins came back"

# unpin forgets it for good.
tc unpin "$MNT/keep/q"
want_pins "/keep/p " "after unpin"
remount
resident_within "$MNT/keep/p" $((16 * MB))
[ "$(dram_bytes "$MNT/keep/q")" -eq 0 ] || fail "unpinned q was loaded at mount"
want_pins "/keep/p " "after unpin and a remount"

# A pin is durable once the command returns: kill -9 straight after.
tc pin "$MNT/keep/q"
tfs_kill9
tfs_mount "$OPTS"
want_pins "/keep/p /keep/q " "after kill -9"
resident_within "$MNT/keep/q" $((8 * MB))

# evict and rm forget pins too; rm at once, though q is still open (its
# inode lives on until the last reference goes: listed then, it had no path).
tc evict "$MNT/keep/p"
exec 3<"$MNT/keep/q" || fail "open q"
rm "$MNT/keep/q" || fail "rm q"
want_pins "" "after evict and rm, q still open"
exec 3<&-
want_pins "" "after evict and rm"
remount
want_pins "" "after evict, rm and a remount"
[ "$(dram_bytes "$MNT/keep/p")" -eq 0 ] || fail "evicted p was loaded at mount"

# A pin that does not fit at the next mount: listed, not active; the mount goes on.
tc pin "$MNT/keep/p"
TFS_DRAM=24M TFS_THREADS=2 remount
want_pins "/keep/p:inactive " "with too little DRAM"
grep -q 'does not fit next to the other pins' "$LOG" || fail "no warning for a pin that did not fit"
cmp -s "$T/p.ref" "$MNT/keep/p" || fail "p reads back wrong with too little DRAM"
remount
resident_within "$MNT/keep/p" $((16 * MB))
want_pins "/keep/p " "with DRAM again"

# Only the owner or root lists them: the list names files in any folder.
if command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
	setpriv --reuid=nobody --regid=nogroup --clear-groups cat "$MNT/.tensorfs/pins" \
		>"$T/nobody.out" 2>&1 && fail "nobody read the pins: $(cat "$T/nobody.out")"
	grep -qi 'permission denied' "$T/nobody.out" || fail "nobody: $(cat "$T/nobody.out")"
fi
tfs_umount || fail "unmount"
"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
exit 0
