#!/bin/bash
# tfsctl against a live mount, its output checked against known activity:
# 100 MiB written, flushed, evicted and read twice show in stats as exactly
# those bytes and a hit rate of one half; where adds up to the file's size
# per tier; pin keeps a file resident while others stream through a small
# DRAM tier, unpin and evict let it go; flush leaves nothing dirty; config
# shows no secret; top fits 80 columns, quits on q and restores the
# terminal; wrong paths, folders that are not a mount, a non-owner and bad
# usage each fail with the right status and a message.
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
chmod 755 "$T" # so that another user can reach the mount point

MB=$((1 << 20))
TFSCTL_OUT="$T/tfsctl.out"
TFSCTL_ERR="$T/tfsctl.err"

# tc ARGS...: run tfsctl on the mount; output in $TFSCTL_OUT, status returned.
tc() {
	"$TFSCTL" -m "$MNT" "$@" >"$TFSCTL_OUT" 2>"$TFSCTL_ERR"
}

# tc_ok ARGS...: tfsctl must succeed.
tc_ok() {
	tc "$@" || fail "tfsctl $* exited $?: $(cat "$TFSCTL_ERR")"
}

# expect STATUS PATTERN ARGS...: tfsctl (without -m) exits STATUS and says PATTERN.
expect() {
	local want=$1 pat=$2 rc=0
	shift 2
	"$TFSCTL" "$@" >"$TFSCTL_OUT" 2>"$TFSCTL_ERR" || rc=$?
	[ "$rc" -eq "$want" ] || fail "tfsctl $*: exit $rc, want $want ($(cat "$TFSCTL_ERR"))"
	grep -qiE -e "$pat" "$TFSCTL_ERR" "$TFSCTL_OUT" ||
		fail "tfsctl $*: no message matching '$pat': $(cat "$TFSCTL_ERR")"
}

# js KEY...: a value from `tfsctl stats --json` (numbers as integers).
js() {
	tc_ok stats --json
	python3 - "$TFSCTL_OUT" "$@" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    v = v[k]
print(int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
PY
}

# where_bytes PATH TIER: bytes of PATH in TIER, from `tfsctl where --json`.
where_bytes() {
	tc_ok where --json "$1"
	python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tiers"].get(sys.argv[2], 0))' \
		"$TFSCTL_OUT" "$2"
}

# Read FILE once with O_DIRECT, up to its end and not past it: the kernel
# passes an O_DIRECT read at the end of the file on (direct_io), and that
# read looks up no block.
rd() {
	dd if="$1" of=/dev/null bs=1M iflag=direct status=none \
		count=$((($(stat -c %s "$1") + MB - 1) / MB)) || fail "reading $1"
}

# --- 1. stats against known activity ---------------------------------------
# No readahead or prefetch: each block read is one lookup, a hit or a miss.
TFS_DRAM=256M TFS_THREADS=4 tfs_mount "readahead=0,prefetch=off"
head -c $((100 * MB)) /dev/urandom >"$T/big.ref"
w0=$(js fuse write_bytes)
nw0=$(js tiers nvme0 write_bytes)
dd if="$T/big.ref" of="$MNT/big" bs=1M oflag=direct status=none || fail "writing big"
tc_ok flush
[ "$(js cache dirty_bytes)" -eq 0 ] || fail "dirty bytes left after tfsctl flush"
[ $(($(js fuse write_bytes) - w0)) -eq $((100 * MB)) ] || fail "fuse write_bytes is not 100 MiB"
[ $(($(js tiers nvme0 write_bytes) - nw0)) -eq $((100 * MB)) ] ||
	fail "nvme0 write_bytes grew by $(($(js tiers nvme0 write_bytes) - nw0)), want 100 MiB"
[ "$(where_bytes "$MNT/big" nvme0)" -eq $((100 * MB)) ] || fail "where: big not all on nvme0"

tc_ok evict "$MNT/big"
[ "$(where_bytes "$MNT/big" dram)" -eq 0 ] || fail "where: big still in dram after evict"
h0=$(js cache hits) m0=$(js cache misses) r0=$(js fuse read_bytes) nr0=$(js tiers nvme0 read_bytes)
o0=$(js fuse read)
rd "$MNT/big"
rd "$MNT/big"
# One miss per block, the first time; every other FUSE read is a hit (one
# read per block where the kernel sends 1 MiB requests: a hit rate of 1/2).
dh=$(($(js cache hits) - h0)) dm=$(($(js cache misses) - m0)) ops=$(($(js fuse read) - o0))
[ "$dm" -eq 100 ] || fail "reading 100 evicted blocks twice: $dm misses, want 100"
[ "$dh" -eq $((ops - 100)) ] || fail "$ops FUSE reads gave $dh hits, want $((ops - 100))"
[ $(($(js fuse read_bytes) - r0)) -eq $((200 * MB)) ] || fail "fuse read_bytes is not 200 MiB"
[ $(($(js tiers nvme0 read_bytes) - nr0)) -eq $((100 * MB)) ] ||
	fail "nvme0 read_bytes grew by $(($(js tiers nvme0 read_bytes) - nr0)), want 100 MiB"
[ "$(where_bytes "$MNT/big" dram)" -eq $((100 * MB)) ] || fail "where: big not in dram after reads"
cmp -s "$T/big.ref" "$MNT/big" || fail "big reads back wrong"

# The human view says what the JSON says.
tc_ok stats --json
want_rate=$(python3 -c 'import json,sys; print("%.1f%%" % (100*json.load(open(sys.argv[1]))["cache"]["hit_rate"]))' "$TFSCTL_OUT")
tc_ok stats
grep -q "^cache     hit rate $want_rate " "$TFSCTL_OUT" || fail "stats: no 'hit rate $want_rate' line"
grep -qE '^TIER +STATE +CAPACITY +USED' "$TFSCTL_OUT" || fail "stats: no tier table"
grep -qE '^nvme0 +up ' "$TFSCTL_OUT" || fail "stats: no nvme0 row"
grep -qE '^QUEUE +QUEUED +DEMAND +PREFETCH +WRITEBACK' "$TFSCTL_OUT" || fail "stats: no queue table"
grep -q '^health    ok$' "$TFSCTL_OUT" || fail "stats: health is not ok"
grep -qE "^fuse +lookup [0-9]+, " "$TFSCTL_OUT" && grep -qE " read_bytes [0-9.]+M," "$TFSCTL_OUT" ||
	fail "stats: no FUSE counters"
grep -q '^dedup     ratio ' "$TFSCTL_OUT" || fail "stats: no dedup line"
grep -qE '^prefetch  accuracy .*, window [0-9]+ blocks$' "$TFSCTL_OUT" || fail "stats: no prefetch line with the window"

# where on a folder adds up its files.
mkdir -p "$MNT/dir/sub"
dd if=/dev/urandom of="$MNT/dir/x" bs=1M count=3 status=none || fail "writing dir/x"
dd if=/dev/urandom of="$MNT/dir/sub/y" bs=1M count=5 status=none || fail "writing dir/sub/y"
tc_ok flush
tc_ok where --json "$MNT/dir"
python3 - "$TFSCTL_OUT" <<'PY' || fail "where --json of a folder: $(cat "$TFSCTL_OUT")"
import json, sys
w = json.load(open(sys.argv[1]))
assert w["files"] == 2 and w["size"] == 8 << 20, w
assert w["tiers"]["nvme0"] == 8 << 20, w
PY
tc_ok where "$MNT/dir"
grep -qE "^$MNT/dir: 2 files, 8.0M \(8388608 bytes\)$" "$TFSCTL_OUT" ||
	fail "where: bad header: $(head -1 "$TFSCTL_OUT")"
grep -qE '^  nvme0 +8.0M  \(8388608 bytes, 100.0% of its size\)$' "$TFSCTL_OUT" ||
	fail "where: bad nvme0 line: $(cat "$TFSCTL_OUT")"

# The mount is found from the current folder, and from PATH alone.
(cd "$MNT/dir/sub" && "$TFSCTL" stats --json >/dev/null) || fail "no mount found from a folder in it"
"$TFSCTL" where "$MNT/dir/x" >/dev/null || fail "no mount found from PATH"
(cd "$MNT/dir" && "$TFSCTL" where sub/y >/dev/null) || fail "a relative PATH was not found"

# config: the effective settings, and nothing secret.
tc_ok config
grep -qx "dram = $((256 * MB))" "$TFSCTL_OUT" || fail "config: no 'dram = $((256 * MB))'"
grep -qx "nvme = $NVME" "$TFSCTL_OUT" || fail "config: no 'nvme = $NVME'"
grep -qx "meta = $META" "$TFSCTL_OUT" || fail "config: no 'meta = $META'"
grep -qiE 'secret|password|token' "$TFSCTL_OUT" && fail "config shows a secret: $(cat "$TFSCTL_OUT")"
# the values in force: dirty is the store's limit, never the 0 that asks
# for the default; and the options that were left out (regression)
cp "$TFSCTL_OUT" "$T/config.out"
dl=$(js cache dirty_limit_bytes)
grep -qx "dirty = $dl" "$T/config.out" ||
	fail "config: dirty is not the limit in force ($dl): $(grep dirty "$T/config.out")"
for k in 'cache_policy = (auto|clock|lru|2q)' 'prefetch = off' 'log_level = info' 'logfile = null'; do
	grep -qxE "$k" "$T/config.out" || fail "config: no '$k'"
done
tc_ok config --json
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); assert c["dram"] == 256 << 20' \
	"$TFSCTL_OUT" || fail "config --json"

# top: frames within 80 columns; quits on q; without q, on SIGTERM.
tc_ok top -n 2 </dev/null
[ "$(grep -c '^TIER ' "$TFSCTL_OUT")" -eq 2 ] || fail "top -n 2 did not draw 2 frames"
grep -qE '^nvme0 +up ' "$TFSCTL_OUT" || fail "top: no nvme0 row"
awk 'length($0) > 80 { exit 1 }' "$TFSCTL_OUT" || fail "top: a line is wider than 80 columns"
rc=0
(sleep 1.5; printf q) | timeout 20 "$TFSCTL" -m "$MNT" top >"$TFSCTL_OUT" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "top did not quit on q (exit $rc)"
[ "$(grep -c '^TIER ' "$TFSCTL_OUT")" -ge 1 ] || fail "top drew nothing before q"
rc=0
timeout 3 "$TFSCTL" -m "$MNT" top </dev/null >"$TFSCTL_OUT" 2>&1 || rc=$?
[ $rc -eq 124 ] || fail "top under timeout: exit $rc, want 124 (stopped by SIGTERM)"
[ "$(grep -c '^TIER ' "$TFSCTL_OUT")" -ge 2 ] || fail "top did not refresh every second"
awk 'length($0) > 80 { exit 1 }' "$TFSCTL_OUT" || fail "top: a line is wider than 80 columns"
# On a terminal: the alternate screen and the cursor come back.
if command -v script >/dev/null; then
	(sleep 1.5; printf q) | timeout 20 script -qec "'$TFSCTL' -m '$MNT' top" /dev/null \
		>"$TFSCTL_OUT" 2>&1 || fail "top on a terminal: exit $?"
	grep -qF $'\033[?1049h' "$TFSCTL_OUT" || fail "top did not take the alternate screen"
	grep -qF $'\033[?1049l' "$TFSCTL_OUT" || fail "top did not restore the screen"
	grep -qF $'\033[?25h' "$TFSCTL_OUT" || fail "top did not show the cursor again"
fi
tfs_umount || fail "unmount"

# --- 2. pin, unpin, evict and prefetch in a small DRAM tier -------------------
TFS_DRAM=64M TFS_THREADS=4 tfs_mount "readahead=0,prefetch=off,allow_other"
mkdir "$MNT/keep"
dd if=/dev/urandom of="$T/p.ref" bs=1M count=16 status=none
cp "$T/p.ref" "$MNT/keep/p"
for i in 1 2 3 4; do
	dd if=/dev/urandom of="$MNT/s$i" bs=1M count=32 status=none || fail "writing s$i"
done
tc_ok flush
tc_ok evict "$MNT/keep"
[ "$(where_bytes "$MNT/keep/p" dram)" -eq 0 ] || fail "p in dram after evict"
tc_ok pin "$MNT/keep"
[ "$(where_bytes "$MNT/keep/p" dram)" -eq $((16 * MB)) ] || fail "p not resident after pin"
[ "$(js cache pinned_bytes)" -eq $((16 * MB)) ] || fail "pinned_bytes is not 16 MiB"
for i in 1 2 3 4; do rd "$MNT/s$i"; done
[ "$(where_bytes "$MNT/keep/p" dram)" -eq $((16 * MB)) ] || fail "pinned p was evicted"
m0=$(js cache misses)
rd "$MNT/keep/p"
[ "$(js cache misses)" -eq "$m0" ] || fail "reading pinned p missed"
tc_ok unpin "$MNT/keep/p"
[ "$(js cache pinned_bytes)" -eq 0 ] || fail "pinned_bytes after unpin"
for i in 1 2 3 4; do rd "$MNT/s$i"; done
[ "$(where_bytes "$MNT/keep/p" dram)" -lt $((16 * MB)) ] || fail "unpinned p stayed resident"
tc_ok evict "$MNT/keep/p"
[ "$(where_bytes "$MNT/keep/p" dram)" -eq 0 ] || fail "p in dram after evict"
tc_ok prefetch "$MNT/keep/p"
for _ in $(seq 1 100); do
	[ "$(where_bytes "$MNT/keep/p" dram)" -eq $((16 * MB)) ] && break
	sleep 0.05
done
[ "$(where_bytes "$MNT/keep/p" dram)" -eq $((16 * MB)) ] || fail "prefetch did not load p"
# A pin that cannot fit fails whole, with a message.
# It names the bound (pin_limit_bytes, in MiB) and what is pinned, once
# each, and the command once (regression: "tfsctl pin: pin: ... does not
# fit in DRAM" named neither).
lim=$(( $(js cache pin_limit_bytes) >> 20 ))
expect 1 "its files do not fit next to what is pinned: pins may hold $lim MiB of this mount's DRAM \(pin_limit_bytes.*\), 0 MiB are pinned already" \
	-m "$MNT" pin "$MNT"
grep -q 'pin: pin:' "$TFSCTL_ERR" && fail "tfsctl pin names the command twice: $(cat "$TFSCTL_ERR")"
[ "$(js cache pinned_bytes)" -eq 0 ] || fail "a failed pin left pins behind"
# Writes without fsync, then flush: nothing dirty.
dd if=/dev/urandom of="$MNT/keep/late" bs=1M count=8 status=none || fail "writing late"
tc_ok flush
[ "$(js cache dirty_bytes)" -eq 0 ] || fail "dirty bytes left after flush"
tc_ok stats
grep -q '^          dirty 0, ' "$TFSCTL_OUT" || fail "stats does not show dirty 0"
cmp -s "$T/p.ref" "$MNT/keep/p" || fail "p reads back wrong"

# --- 3. errors: each exits non-zero with a message -------------------------
expect 1 'is not on a tensorfs mount' -m "$T" stats
expect 1 'is not on a tensorfs mount' pin "$T/p.ref"
expect 1 'not inside the tensorfs mount' -m "$MNT" pin "$T/p.ref"
expect 1 'No such file' -m "$MNT" pin "$MNT/nope"
expect 1 'No such file' where "$MNT/nope"
expect 1 'No such file' -m "$T/nope" stats
(cd / && "$TFSCTL" stats >"$TFSCTL_OUT" 2>"$TFSCTL_ERR") && fail "stats outside a mount succeeded"
grep -q 'current folder' "$TFSCTL_ERR" || fail "stats outside a mount: $(cat "$TFSCTL_ERR")"
expect 2 'unknown command' frobnicate
expect 2 'no command' -m "$MNT"
expect 2 'needs a PATH' -m "$MNT" pin
expect 2 'takes no' -m "$MNT" flush "$MNT"
expect 2 'takes no' -m "$MNT" scrub extra
expect 2 'takes no' -m "$MNT" stats extra
expect 2 'unknown' -m "$MNT" stats --bogus
expect 2 'no --json' -m "$MNT" top --json
expect 2 '-n wants' -m "$MNT" top -n zero
expect 2 'needs a META_DIR' fsck
expect 2 'usage' --bogus
# A user other than the mount's owner may look, but not steer.
setpriv --reuid=65534 --regid=65534 --clear-groups "$TFSCTL" -m "$MNT" stats >/dev/null ||
	fail "another user cannot run tfsctl stats"
rc=0
setpriv --reuid=65534 --regid=65534 --clear-groups "$TFSCTL" -m "$MNT" flush \
	2>"$TFSCTL_ERR" || rc=$?
[ $rc -eq 1 ] || fail "another user's flush: exit $rc, want 1"
grep -q "permission denied" "$TFSCTL_ERR" || fail "another user's flush: $(cat "$TFSCTL_ERR")"
kill -0 "$TFS_PID" || fail "the daemon died"

# Every command has --help, with its text from help.txt after the usage
# line; tfsctl --help lists them all.
tc_ok --help
for c in stats top where prefetch pin unpin evict pins flush scrub config metrics unmount fsck; do
	grep -qE "^  $c( |$)" "$TFSCTL_OUT" || fail "tfsctl --help does not list $c"
	"$TFSCTL" "$c" --help >"$T/help.out" 2>&1 || fail "tfsctl $c --help exited $?"
	grep -q "^usage: tfsctl .*$c" "$T/help.out" || fail "tfsctl $c --help: $(head -1 "$T/help.out")"
	sed -n 3p "$T/help.out" | grep -qE '^[A-Z][a-z]+ ' ||
		fail "tfsctl $c --help has no text after its usage line: $(sed -n 3p "$T/help.out")"
done
[ "$(sed -n '/^commands:/,/^$/p' "$TFSCTL_OUT" | grep -cE '^  [a-z]')" -eq 14 ] ||
	fail "tfsctl --help lists $(sed -n '/^commands:/,/^$/p' "$TFSCTL_OUT" | grep -cE '^  [a-z]') commands, the loop above checks 14"
tfs_umount || fail "unmount"

# --- 4. config with an s3 tier shows no credential (when s3rver is here) ----
rc=0
(
	. "$(dirname "$0")/../s3/lib_s3.sh"
	s3_start
	TFS_DRAM=128M TFS_THREADS=4 tfs_mount "$(s3_mount_opts tfsctl)"
	"$TFSCTL" -m "$MNT" config >"$T/config.out" || fail "config with s3 exited $?"
	"$TFSCTL" -m "$MNT" config --json >>"$T/config.out" || fail "config --json with s3"
	grep -q '^s3.bucket = ' "$T/config.out" || fail "config does not describe the s3 tier"
	s3_secret_leaks "$T/config.out"
	tfs_umount || fail "unmount (s3)"
) || rc=$?
case $rc in
0) ;;
77) echo "note: s3 part skipped (no s3rver)" ;;
*) fail "the s3 part failed" ;;
esac
echo "PASS: tfsctl"
