#!/bin/bash
# The metadata store stays bounded under metadata operations alone (case 3
# of issue 37). Until a sync point, LMDB keeps every page that the commits
# since the last one replaced; only write-back commits used to lead to a
# sync point, so a flood of creates, unlinks and chmods with no data grew
# data.mdb without bound (2.3 GB for 30,000 creates and unlinks), and on a
# small meta folder one user's chmods made root's requests fail with EIO.
# Metadata commits now lead to sync points too (tiers/flush.c).
#
#   1. As nobody, in a world-writable folder (allow_other): 30,000 pairs of
#      create and unlink, then 5,000 chmod of one file. data.mdb, measured
#      with stat and du, stays under META_BOUND (64 MiB), and the stats
#      report its size and the commits not yet synced (0 within 30 s).
#   2. The meta folder on a 64 MiB tmpfs: nobody's 20,000 chmod all
#      succeed, and root's touch after them too.
#   3. The meta folder on a 10 MiB tmpfs: 3,000 files made, then rm -r;
#      each unlink succeeds (the store's growth between sync points is
#      bounded by its filesystem's room, fs/meta_durable.c).
#   4. 100,000 empty files: data.mdb stays under FILES_BOUND (256 MiB), the
#      live metadata (the stats' tree_bytes) under it too; the remount's
#      time and the daemon's memory are printed.
#
# Each part runs whatever the one before found, and the test fails at the
# end, so that a run on the old code shows every part that fails there.
. "$(dirname "$0")/lib.sh"
command -v setpriv >/dev/null || skip "no setpriv"
chmod 755 "$T" # so that nobody can reach the mount point

MiB=$((1 << 20))
META_BOUND=$((64 * MiB))
FILES_BOUND=$((256 * MiB))
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
# A python3 that nobody may run too (a per-user install may not be).
PYTHON=$(command -v python3)
"${NOBODY[@]}" "$PYTHON" -c '' 2>/dev/null || PYTHON=/usr/bin/python3
"${NOBODY[@]}" "$PYTHON" -c '' 2>/dev/null || skip "no python3 that nobody may run"
FAILED=()
TMPFS=""

tfs_extra_cleanup() {
	[ -n "$TMPFS" ] && umount "$TMPFS" 2>/dev/null
	true
}

check() { # STATUS MESSAGE: anything but 0 fails (a count of failures, or an exit status)
	if [ "$1" != 0 ]; then
		echo "FAIL: $2" >&2
		FAILED+=("$2")
	fi
}

# ops DIR WHAT N: N metadata operations as nobody (ops.py below); prints
# how many failed.
cat >"$T/ops.py" <<'PY'
import os, sys, time
d, what, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t, errs = time.time(), 0
if what == "pairs":
    for i in range(n):
        p = os.path.join(d, "f%d" % (i % 64))
        try:
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
            os.unlink(p)
        except OSError:
            errs += 1
elif what == "chmod":
    p = os.path.join(d, "c")
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
    for i in range(n):
        try:
            os.chmod(p, 0o600 if i & 1 else 0o644)
        except OSError:
            errs += 1
elif what == "files":
    for i in range(n):
        try:
            os.close(os.open(os.path.join(d, "e%06d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
        except OSError:
            errs += 1
sys.stderr.write("   %s x %d: %.1f s, %d failed\n" % (what, n, time.time() - t, errs))
print(errs)
PY
chmod 644 "$T/ops.py"
ops() {
	"${NOBODY[@]}" "$PYTHON" "$T/ops.py" "$@" 2>&1 >"$T/ops.out" | cat >&2
	cat "$T/ops.out"
}

pub() {
	mkdir -p "$MNT/pub" && chmod 1777 "$MNT/pub" || fail "cannot make $MNT/pub"
}

size() { stat -c %s "$META/data.mdb"; }
disk() { du -B1 "$META/data.mdb" | cut -f1; }

# A sync point has covered every commit: the daemon's count, where it has
# one; a daemon without it (the old code) gets 3 s, three sync intervals.
synced() {
	local i
	for i in $(seq 1 300); do
		local n
		n=$(tfs_stat_json meta unsynced_commits 2>/dev/null) || {
			sleep 3
			return 0
		}
		[ "$n" = 0 ] && return 0
		sleep 0.1
	done
	return 1
}

# tmpfs_store SIZE: a new store whose meta folder is on a tmpfs of SIZE,
# mounted (allow_other) with its public folder.
tmpfs_store() {
	TMPFS="$T/metafs"
	mkdir -p "$TMPFS"
	mount -t tmpfs -o "size=$1,mode=0700" tmpfs "$TMPFS" || skip "cannot mount a tmpfs"
	META="$TMPFS/meta"
	rm -rf "$NVME" && mkdir -p "$NVME" # a new store
	tfs_mount "allow_other"
	pub
}

# tmpfs_store_end PART: root's touch still succeeds; the size is printed;
# the daemon exits cleanly; the next part gets a new store on $T.
tmpfs_store_end() {
	touch "$MNT/root-file" 2>"$T/touch.err"
	check $? "root's touch failed in part $1: $(cat "$T/touch.err")"
	echo "   data.mdb: $(($(size) / MiB)) MiB; tmpfs: $(df -B1M --output=used "$TMPFS" | tail -1) MiB used"
	tfs_umount
	check $? "the daemon's exit after part $1"
	umount "$TMPFS" && TMPFS=""
	META="$T/meta"
	rm -rf "$META" "$NVME"
	mkdir -p "$NVME"
}

echo "1. 30,000 creates and unlinks, 5,000 chmod, as nobody"
tfs_mount "allow_other"
pub
errs=$(ops "$MNT/pub" pairs 30000)
check "$errs" "$errs of nobody's creates and unlinks failed"
errs=$(ops "$MNT/pub" chmod 5000)
check "$errs" "$errs of nobody's chmods failed"
synced
check $? "commits left unsynced 10 s after the last"
s=$(size)
d=$(disk)
echo "   data.mdb: $((s / MiB)) MiB, $((d / MiB)) MiB on disk (bound $((META_BOUND / MiB)) MiB)"
[ "$s" -lt "$META_BOUND" ] && [ "$d" -lt "$META_BOUND" ]
check $? "data.mdb holds $s bytes ($d on disk) after metadata operations alone"
if used=$(tfs_stat_json meta used_bytes 2>/dev/null); then
	f=$(tfs_stat_json meta file_bytes)
	tree=$(tfs_stat_json meta tree_bytes)
	echo "   stats: file $f, used $used, tree $tree"
	[ "$f" = "$s" ] && [ "$used" -le "$f" ] && [ "$tree" -gt 0 ] && [ "$tree" -le "$used" ]
	check $? "stats meta: file $f used $used tree $tree against data.mdb's $s"
else
	check 1 "the stats do not report the metadata's size"
fi
tfs_umount || fail "unmount after part 1"

echo "2. meta on a 64 MiB tmpfs: nobody's chmods, then root's touch"
tmpfs_store 64M
errs=$(ops "$MNT/pub" chmod 20000)
check "$errs" "$errs of nobody's 20,000 chmods failed with meta on a 64 MiB tmpfs"
tmpfs_store_end 2

echo "3. meta on a 10 MiB tmpfs: 3,000 files made, then removed with rm -r"
# Regression: counted in commits alone, the pages LMDB keeps until the
# next sync point (about 10 a commit, 256 to 512 commits a window) grew the
# store past a small filesystem's room while most of it was free pages:
# rm failed with ENOSPC, 20 MB free before it began (mount-fault-matrix).
tmpfs_store 10M
errs=$(ops "$MNT/pub" files 3000)
check "$errs" "$errs of 3,000 creates failed with meta on a 10 MiB tmpfs"
rm -r "$MNT/pub" 2>"$T/rm.err"
check $? "rm -r of 3,000 files with meta on a 10 MiB tmpfs: $(sort "$T/rm.err" | uniq -c | sort -rn | head -n 3)"
tmpfs_store_end 3

echo "4. 100,000 empty files"
tfs_mount "allow_other"
pub
errs=$(ops "$MNT/pub" files 100000)
check "$errs" "$errs of nobody's 100,000 creates failed"
synced
s=$(size)
tree=$(tfs_stat_json meta tree_bytes 2>/dev/null || echo "?")
echo "   data.mdb: $((s / MiB)) MiB, live metadata (tree_bytes) $tree; daemon:" \
	"$(grep -E 'Rss(Anon|File)' "/proc/$TFS_PID/status" | tr -s ' \t\n' ' ')"
[ "$s" -lt "$FILES_BOUND" ]
check $? "data.mdb holds $s bytes for 100,000 empty files"
tfs_umount || fail "unmount after part 4"
t0=$(date +%s%N)
tfs_mount "allow_other"
t1=$(date +%s%N)
n=$(find "$MNT/pub" -type f | wc -l)
echo "   remount: $(((t1 - t0) / 1000000)) ms; $n files"
[ "$n" -eq 100000 ]
check $? "the remount shows $n of 100,000 files"
tfs_umount || fail "unmount after part 4's remount"

[ ${#FAILED[@]} -eq 0 ] || fail "${#FAILED[@]} checks failed: ${FAILED[*]}"
echo "PASS"
