#!/bin/bash
# The control file /.tensorfs/ctl: pin keeps a file resident while others
# stream through a small DRAM tier, unpin lets it go, evict drops it,
# prefetch loads it, flush leaves nothing dirty; the tiers xattr and the
# stats agree with all of that. A fixed list of malformed commands and a
# random fuzz each get EINVAL (or ENOENT for unknown paths) and leave the
# daemon up with every file intact; a non-owner may read the stats but
# not write ctl, with or without default_permissions.
. "$(dirname "$0")/lib.sh"
chmod 755 "$T" # so that another user can reach the mount point

export TFS_DRAM=64M TFS_THREADS=4
CTL="$MNT/.tensorfs/ctl"

# ctl CMD: write one command; prints the error text, returns dd's status.
ctl() {
	printf '%s' "$1" | dd of="$CTL" bs=8k status=none 2>&1
}

tiers() { # tiers FILE TIER: bytes of FILE in TIER, from user.tensorfs.tiers
	python3 -c 'import json,os,sys; print(json.loads(os.getxattr(sys.argv[1], "user.tensorfs.tiers"))[sys.argv[2]])' "$1" "$2"
}

rd() { dd if="$1" of=/dev/null bs=1M iflag=direct status=none || fail "reading $1"; }

tfs_mount "readahead=0,prefetch=off"
mkdir -p "$MNT/dir/sub"
dd if=/dev/urandom of="$T/p.ref" bs=1M count=16 status=none
cp "$T/p.ref" "$MNT/dir/p"
dd if=/dev/urandom of="$MNT/dir/sub/q" bs=1M count=4 status=none
for i in 1 2 3 4; do
	dd if=/dev/urandom of="$MNT/s$i" bs=1M count=32 status=none || fail "writing s$i"
done
sum_before=$(cd "$MNT" && md5sum dir/p dir/sub/q s1 s2 s3 s4)

out=$(ctl flush) || fail "flush: $out"
[ "$(tfs_stat_json cache dirty_bytes)" -eq 0 ] || fail "dirty bytes left after flush"
[ "$(tiers "$MNT/dir/p" nvme0)" -eq $((16 << 20)) ] || fail "p not all on nvme0 after flush"
[ "$(tiers "$MNT/dir" nvme0)" -eq $((20 << 20)) ] || fail "the folder's tiers do not sum p and q"

# evict, then the tiers xattr says nothing of p is in DRAM
out=$(ctl "evict /dir") || fail "evict: $out"
[ "$(tiers "$MNT/dir/p" dram)" -eq 0 ] || fail "p still in DRAM after evict"
[ "$(tiers "$MNT/dir/sub/q" dram)" -eq 0 ] || fail "evict of a folder missed dir/sub/q"

# pin the folder: p and q resident, and they stay while 128 MiB stream by
out=$(ctl "pin /dir") || fail "pin: $out"
[ "$(tiers "$MNT/dir/p" dram)" -eq $((16 << 20)) ] || fail "p not resident after pin"
[ "$(tfs_stat_json cache pinned_bytes)" -eq $((20 << 20)) ] || fail "pinned_bytes is not 20 MiB"
for i in 1 2 3 4; do rd "$MNT/s$i"; done
[ "$(tiers "$MNT/dir/p" dram)" -eq $((16 << 20)) ] || fail "pinned p was evicted"
m0=$(tfs_stat_json cache misses)
rd "$MNT/dir/p"
[ "$(tfs_stat_json cache misses)" -eq "$m0" ] || fail "reading pinned p missed"

# unpin: streaming evicts it again
out=$(ctl "unpin /dir") || fail "unpin: $out"
[ "$(tfs_stat_json cache pinned_bytes)" -eq 0 ] || fail "pinned_bytes after unpin"
for i in 1 2 3 4; do rd "$MNT/s$i"; done
[ "$(tiers "$MNT/dir/p" dram)" -lt $((16 << 20)) ] || fail "unpinned p stayed resident"

# a pin larger than DRAM allows fails whole, pinning nothing
out=$(ctl "pin /") && fail "pinning 148 MiB in 64 MiB succeeded"
case "$out" in *"No space left"*) ;; *) fail "pin too big: '$out', want ENOSPC" ;; esac
[ "$(tfs_stat_json cache pinned_bytes)" -eq 0 ] || fail "a failed pin left pins behind"

# prefetch by inode number loads the file without a read
ino=$(stat -c %i "$MNT/dir/sub/q")
out=$(ctl "evict ino:$ino") || fail "evict by inode: $out"
out=$(ctl "prefetch ino:$ino") || fail "prefetch: $out"
for i in $(seq 1 100); do
	[ "$(tiers "$MNT/dir/sub/q" dram)" -eq $((4 << 20)) ] && break
	sleep 0.05
done
[ "$(tiers "$MNT/dir/sub/q" dram)" -eq $((4 << 20)) ] || fail "prefetch did not load q"

# malformed commands: EINVAL; unknown paths: ENOENT
while IFS= read -r bad; do
	out=$(ctl "$bad") && fail "bad command accepted: '$bad'"
	case "$out" in *"Invalid argument"*) ;; *) fail "'$bad': '$out', want EINVAL" ;; esac
done <<'BAD'
bogus
pin
pin  /dir
pin dir
pin /dir/
pin /dir/../s1
pin /./dir
flush now
evict
prefetch ino:
prefetch ino:abc
prefetch ino:0
prefetch ino:99999999999999999999
 pin /dir
PIN /dir
BAD
out=$(printf 'pin /dir\nflush' | dd of="$CTL" bs=8k status=none 2>&1) && fail "two commands in one write"
out=$(ctl "pin /nope") && fail "pin of a missing path succeeded"
case "$out" in *"No such file"*) ;; *) fail "missing path: '$out', want ENOENT" ;; esac
out=$(head -c 5000 /dev/zero | tr '\0' a | dd of="$CTL" bs=8k status=none 2>&1) &&
	fail "a 5000-byte command was accepted"
# reading ctl, or writing the read-only files, is refused
cat "$CTL" >/dev/null 2>&1 && fail "ctl could be read"
(echo x >"$MNT/.tensorfs/stats") 2>/dev/null && fail "stats could be written"

# fuzz: random bytes and mutated commands, one write each
python3 - "$CTL" <<'PY' || fail "fuzz: a write was accepted or the daemon went away"
import errno, os, random, sys
rng = random.Random(int.from_bytes(os.urandom(4), "little"))
seeds = [b"pin /dir", b"evict /dir/sub/q", b"flush", b"prefetch ino:1", b"unpin /"]
accepted = 0
for i in range(400):
    if i % 2:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    else:
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            pos = rng.randrange(len(data) + 1)
            op = rng.randrange(3)
            if op == 0:
                data[pos:pos] = bytes([rng.randrange(256)])
            elif op == 1 and pos < len(data):
                del data[pos]
            elif pos < len(data):
                data[pos] = rng.randrange(256)
        data = bytes(data)
    fd = os.open(sys.argv[1], os.O_WRONLY)
    try:
        n = os.write(fd, data)
        if n != len(data):
            sys.exit("short write %d of %d for %r" % (n, len(data), data))
        accepted += 1  # a mutation can still be a valid command
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOENT, errno.ENOSPC):
            sys.exit("unexpected %s for %r" % (e, data))
    finally:
        os.close(fd)
print("fuzz: 400 writes, %d valid" % accepted)
PY
kill -0 "$TFS_PID" || fail "the daemon died"
out=$(ctl "unpin /") || fail "unpin after fuzz: $out"
sum_after=$(cd "$MNT" && md5sum dir/p dir/sub/q s1 s2 s3 s4)
[ "$sum_before" = "$sum_after" ] || fail "file contents changed"
cmp "$T/p.ref" "$MNT/dir/p" || fail "p differs"
tfs_umount || fail "unmount"
if [ -n "${TFSCTL:-}" ] && [ -x "$TFSCTL" ]; then
	"$TFSCTL" fsck "$META" || fail "fsck after the fuzz"
fi

# A non-owner: may read stats, may not write ctl, with the kernel's
# permission checks and with only the daemon's own.
for perm in "" ",no_default_permissions"; do
	tfs_mount "allow_other$perm"
	setpriv --reuid=65534 --regid=65534 --clear-groups cat "$MNT/.tensorfs/stats" >/dev/null ||
		fail "nobody cannot read stats ($perm)"
	setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "printf flush > '$CTL'" 2>/dev/null &&
		fail "nobody could write ctl ($perm)"
	out=$(ctl flush) || fail "the owner cannot write ctl ($perm): $out"
	tfs_umount || fail "unmount"
done
echo "PASS: control file"
