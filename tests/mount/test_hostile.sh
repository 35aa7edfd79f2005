#!/bin/bash
# Hostile local users (findings 2, 3 and 12 of the security probe of issue
# 12). The rule (docs/security.md, "What a request may cost"): no request's
# cost may grow with a file's logical size, only with the blocks it stores,
# and no unprivileged request may hold a FUSE worker for long.
#
#   1. user.tensorfs.tiers counts bytes right: a 3 MiB file in a 1 MiB-block
#      store is 3 MiB in DRAM when written and on nvme0 after a flush, and
#      only on nvme0 after a remount; a short last block counts its bytes,
#      the blocks of a sparse file count and its holes do not.
#   2. nobody makes a sparse file of 2^63-1 bytes (root has one too); 32
#      parallel getxattr of user.tensorfs.tiers on it and 32 on / finish
#      within 20 s, and ls and cat answer meanwhile. (Regression: each
#      getxattr stepped through 2^43 block indexes, and 32 of them held
#      every FUSE worker, hanging the mount for everyone.)
#   3. The prefetch hint on it issues only its stored blocks, and a hint on
#      another file is still served; ctl pin and evict of it finish.
#      (Regression: the prefetch thread stepped through 2^43 indexes and
#      served no other hint; pin asked for 2^43 blocks and failed.)
#   4. copy_file_range of it, sharing blocks or by value, returns promptly
#      with the right bytes.
#   5. A folder's tiers sum only what the caller may search: nobody does
#      not see the data in root's 0700 folder, a group's 0750 folder counts
#      for its members only, and a folder it may read but not search is
#      refused. (Regression: the hidden data was summed.)
#   6. An idle mount uses no CPU: after writes, syncs and a remount's worth
#      of work are done, the daemon's threads take less than 5% of a core
#      over 3 s. (Regression: the flusher spun once sync_interval_ms passed
#      with nothing to sync, a whole core on every mount.)
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
command -v setpriv >/dev/null || skip "no setpriv"
chmod 755 "$T" # so that nobody can reach the mount point

export TFS_DRAM=256M TFS_THREADS=16
MiB=$((1 << 20))
CTL="$MNT/.tensorfs/ctl"
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
GRP=4242 # a group nobody is not in, unless asked
# A python3 that nobody may run too (a per-user install may not be).
PYTHON=$(command -v python3)
"${NOBODY[@]}" "$PYTHON" -c '' 2>/dev/null || PYTHON=/usr/bin/python3
"${NOBODY[@]}" "$PYTHON" -c '' 2>/dev/null || skip "no python3 that nobody may run"

# Every request below is bounded by within (lib.sh), so that a daemon that
# hangs fails the test instead of hanging it.

# tiers_json PATH [PREFIX...]: the xattr of PATH, read within 10 s (as PREFIX says).
tiers_json() {
	local path=$1
	shift
	within 10 "$@" "$PYTHON" -c \
		'import os,sys; print(os.getxattr(sys.argv[1], "user.tensorfs.tiers").decode())' \
		"$path" >"$T/xattr.out" 2>&1 || return 1
	cat "$T/xattr.out"
}

# tier JSON TIER: one tier's bytes.
tier() {
	"$PYTHON" -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}

# want PATH TIER BYTES [PREFIX...]: PATH holds exactly BYTES in TIER.
want() {
	local path=$1 t=$2 bytes=$3 j
	shift 3
	j=$(tiers_json "$path" "$@") || fail "getxattr of $path did not answer within 10 s"
	[ "$(tier "$j" "$t")" = "$bytes" ] || fail "$path: $j, want $t = $bytes"
}

ctl() { # ctl CMD: one command, within 20 s; prints the error
	within 20 sh -c 'printf "%s" "$1" >"$2"' sh "$1" "$CTL" >"$T/ctl.out" 2>&1
	local rc=$?
	cat "$T/ctl.out"
	return $rc
}

flush() {
	within 30 "$TFSCTL" -m "$MNT" flush >"$T/flush.out" 2>&1 ||
		fail "tfsctl flush: $(cat "$T/flush.out")"
}

# answers WHEN: ls and a read of another file reply within 5 s.
answers() {
	within 5 ls "$MNT" >/dev/null 2>&1 || fail "ls did not answer within 5 s ($1)"
	within 5 cmp -s "$MNT/other" "$T/other.ref" ||
		fail "a read of another file did not answer within 5 s, or differs ($1)"
}

echo "1. byte counts"
tfs_mount "block=1M,allow_other"
dd if=/dev/urandom of="$MNT/f3" bs=1M count=3 status=none || fail "writing f3"
want "$MNT/f3" dram $((3 * MiB))
python3 - "$MNT" <<'PY' || fail "writing odd and sparse"
import os, sys
m = sys.argv[1]
with open(m + "/odd", "wb") as f:
    f.write(os.urandom(3 * 2**20 + 1000))
fd = os.open(m + "/sparse", os.O_CREAT | os.O_WRONLY, 0o644)
far = 2**62
os.pwrite(fd, os.urandom(2**20), far - 2**20)  # a whole block
os.pwrite(fd, os.urandom(1000), far)  # the last block, 1000 bytes of it
os.close(fd)
PY
flush
want "$MNT/f3" nvme0 $((3 * MiB))
want "$MNT/f3" dram $((3 * MiB))
want "$MNT/odd" nvme0 $((3 * MiB + 1000))
want "$MNT/odd" dram $((3 * MiB + 1000))
want "$MNT/sparse" nvme0 $((MiB + 1000))
want "$MNT/sparse" dram $((MiB + 1000))
tfs_umount || fail "unmount"
tfs_mount "block=1M,allow_other"
want "$MNT/f3" nvme0 $((3 * MiB))
want "$MNT/f3" dram 0
want "$MNT/sparse" nvme0 $((MiB + 1000))
want "$MNT/sparse" dram 0
cat "$MNT/f3" >/dev/null || fail "reading f3"
want "$MNT/f3" dram $((3 * MiB))
echo "   3 MiB in dram when written, on nvme0 after flush, only there after remount"

echo "2. getxattr on a 2^63-1 byte file, 64 at once"
mkdir -m 1777 "$MNT/pub"
"${NOBODY[@]}" "$PYTHON" - "$MNT/pub/huge" <<'PY' || fail "nobody could not make a sparse file"
import os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
os.ftruncate(fd, 2**63 - 1)
os.pwrite(fd, b"h" * 2**20, 2**40)  # one stored block, far in
os.close(fd)
PY
python3 -c 'import os,sys; open(sys.argv[1], "w").close(); os.truncate(sys.argv[1], 2**63 - 1)' \
	"$MNT/root-huge" || fail "root could not make a sparse file"
dd if=/dev/urandom of="$T/other.ref" bs=1M count=2 status=none
cp "$T/other.ref" "$MNT/other" || fail "writing other"
start=$(date +%s)
"${NOBODY[@]}" "$PYTHON" - "$MNT/pub/huge" "$MNT" >"$T/hammer.out" 2>&1 <<'PY' &
import os, sys, threading
errors = []
def one(path):
    try:
        os.getxattr(path, "user.tensorfs.tiers")
    except OSError as e:
        errors.append("%s: %s" % (path, e))
threads = [threading.Thread(target=one, args=(p,)) for p in sys.argv[1:] for _ in range(32)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    sys.exit("; ".join(errors[:3]))
PY
hammer=$!
sleep 0.5
answers "while 64 getxattr ran"
waitfor "$hammer" 20 || fail "64 parallel getxattr did not all finish within 20 s: $(cat "$T/hammer.out")"
echo "   done in $(($(date +%s) - start)) s"
want "$MNT/pub/huge" dram $MiB "${NOBODY[@]}"

echo "3. prefetch hint and ctl pin, evict on it"
flush
out=$(ctl "evict /pub/huge") || fail "evict of the 2^63-byte file: $out"
out=$(ctl "evict /other") || fail "evict of other: $out"
want "$MNT/pub/huge" dram 0
want "$MNT/other" dram 0
issued0=$(tfs_stat_json prefetch issued)
within 10 "${NOBODY[@]}" setfattr -n user.tensorfs.prefetch -v 1 "$MNT/pub/huge" ||
	fail "the prefetch hint on the 2^63-byte file did not return"
within 10 setfattr -n user.tensorfs.prefetch -v 1 "$MNT/other" ||
	fail "the prefetch hint on other did not return"
for i in $(seq 1 100); do
	j=$(tiers_json "$MNT/other") || fail "getxattr of other did not answer"
	[ "$(tier "$j" dram)" -eq $((2 * MiB)) ] && break
	sleep 0.1
done
[ "$(tier "$j" dram)" -eq $((2 * MiB)) ] ||
	fail "a hint on another file was not served in 10 s: other is $j"
want "$MNT/pub/huge" dram $MiB
issued=$(($(tfs_stat_json prefetch issued) - issued0))
[ "$issued" -le 64 ] || fail "the hints issued $issued prefetches for 3 stored blocks"
answers "after the hint"
out=$(ctl "pin /pub/huge") || fail "pin of the 2^63-byte file: $out"
[ "$(tfs_stat_json cache pinned_bytes)" -eq "$MiB" ] || fail "pin of huge: pinned_bytes is not 1 MiB"
out=$(ctl "evict /pub/huge") || fail "evict of the pinned 2^63-byte file: $out"
want "$MNT/pub/huge" dram 0
[ "$(tfs_stat_json cache pinned_bytes)" -eq 0 ] || fail "pinned bytes left after evict"
out=$(ctl "pin /root-huge") || fail "pin of root's 2^63-byte file: $out"
out=$(ctl "unpin /root-huge") || fail "unpin of root's 2^63-byte file: $out"
echo "   hints served in turn ($issued issued), pin and evict done"

echo "4. copy_file_range of it"
within 20 "${NOBODY[@]}" "$PYTHON" - "$MNT/pub" >"$T/copy.out" 2>&1 <<'PY' ||
	fail "copy_file_range: $(cat "$T/copy.out")"
import os, sys
d = sys.argv[1]
fi = os.open(d + "/huge", os.O_RDONLY)
for name, src, dst in (("shared", 2**40, 0), ("byvalue", 2**40, 5)):
    fo = os.open(d + "/" + name, os.O_CREAT | os.O_WRONLY, 0o644)
    n = os.copy_file_range(fi, fo, 2**62, src, dst)
    if not 0 < n <= 2**32:
        sys.exit("%s: copy_file_range returned %d" % (name, n))
    os.close(fo)
    with open(d + "/" + name, "rb") as f:
        if os.pread(f.fileno(), 2**20, dst) != b"h" * 2**20:
            sys.exit("%s: the copy differs" % name)
os.close(fi)
PY
answers "after the copies"
echo "   shared and by-value copies returned"

echo "5. a folder's tiers as another user"
mkdir -p "$MNT/shared/secret" "$MNT/shared/grp" "$MNT/shared/nogrp" "$MNT/shared/readonly"
chmod 755 "$MNT/shared"
chmod 700 "$MNT/shared/secret"
chgrp "$GRP" "$MNT/shared/grp" "$MNT/shared/nogrp"
chmod 750 "$MNT/shared/grp"
chmod 705 "$MNT/shared/nogrp" # others may search, the group may not
chmod 744 "$MNT/shared/readonly"
dd if=/dev/urandom of="$MNT/shared/visible" bs=1M count=1 status=none
dd if=/dev/urandom of="$MNT/shared/secret/data" bs=1M count=2 status=none
dd if=/dev/urandom of="$MNT/shared/grp/g" bs=1M count=4 status=none
dd if=/dev/urandom of="$MNT/shared/nogrp/n" bs=1M count=8 status=none
flush
want "$MNT/shared" nvme0 $((15 * MiB))
want "$MNT/shared" nvme0 $((9 * MiB)) "${NOBODY[@]}"
want "$MNT/shared" nvme0 $((5 * MiB)) setpriv --reuid=65534 --regid=65534 --groups="$GRP"
want "$MNT/shared" nvme0 $((5 * MiB)) setpriv --reuid=65534 --regid="$GRP" --clear-groups
root_all=$(tier "$(tiers_json "$MNT")" nvme0) || fail "getxattr of /"
nobody_all=$(tier "$(tiers_json "$MNT" "${NOBODY[@]}")" nvme0) || fail "getxattr of / as nobody"
[ $((root_all - nobody_all)) -eq $((6 * MiB)) ] ||
	fail "/ shows nobody $nobody_all bytes of root's $root_all; want all but 6 MiB"
within 10 "${NOBODY[@]}" getfattr -n user.tensorfs.tiers "$MNT/shared/readonly" \
	>"$T/getfattr.out" 2>&1 && fail "nobody read the tiers of a folder it may not search"
grep -q "Permission denied" "$T/getfattr.out" ||
	fail "readonly folder: '$(cat "$T/getfattr.out")', want EACCES"
echo "   nobody sees 9 of 15 MiB, its group's member 5"

tfs_umount || fail "unmount"
"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(tail -n 5 "$T/fsck.out")"

echo "6. an idle mount"
# cpu_ticks: user + system clock ticks of the daemon, all threads.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$TFS_PID/stat"; }
tfs_mount
dd if=/dev/urandom of="$MNT/idle" bs=1M count=8 conv=fsync status=none || fail "write"
# Idle: nothing dirty and nothing left to make durable.
for i in $(seq 1 100); do
	[ "$(tfs_stat_json cache dirty_bytes)" -eq 0 ] &&
		[ "$(tfs_stat_json cache unsynced_blocks)" -eq 0 ] && break
	sleep 0.05
done
sleep 1.5 # past sync_interval_ms (1 s), where the flusher used to start spinning
c0=$(cpu_ticks)
sleep 3
c1=$(cpu_ticks)
hz=$(getconf CLK_TCK)
echo "   $((c1 - c0)) ticks of CPU in 3 s idle ($hz a second)"
[ $(((c1 - c0) * 100)) -lt $((3 * hz * 5)) ] ||
	fail "an idle mount used $((c1 - c0)) ticks in 3 s: more than 5% of a core"
tfs_umount || fail "unmount"
echo "PASS: hostile users"
