#!/bin/bash
# Requests per GB on the s3 tier, counted where they cannot hide: at a
# proxy (tools/s3proxy.js) between the daemon and the server, which delays
# each request's first byte by 20 ms, as a region does. Counts, not times:
# the machine's load changes how fast, not how many.
#
# s3 alone (nvme=none), dram=512M, the default object size (a sixteenth of
# the DRAM tier: 32 MiB). A file is written sequentially in two steps, each
# ending with an fsync: 7 MiB (an object closed with 7 blocks, which moves
# every later object off the file's multiples of 32), then 505 MiB more,
# more than the dirty mark (384 MiB), so that write-back runs in the
# background too. Then, after a remount and drop_caches, it is read back
# sequentially.
#   - the PUTs of the 505 MiB step are at most 1.1 x its objects + 1: the
#     write-back hands whole objects to the engine (fed a block at a time,
#     with 32 blocks in flight, objects went with a third of their blocks);
#   - the GETs of the read are at most 1.1 x the objects + 2: one ranged
#     GET per object, as the reader's window ends where objects end (ended
#     on the file's multiples of the object size, it made two per object);
#   - the bytes read back are the bytes written.
# Bound on a hang: each step at most 300 s (meson's timeout: 600 s).

. "$(dirname "$0")/lib_s3.sh"

LAT_MS=${LAT_MS:-20}
HEAD_MB=7
REST_MB=505
OBJ_MB=32 # dram / 16
export TFS_DRAM=512M TFS_THREADS=8

s3_start
s3_proxy_start "$LAT_MS"
OPTS="nvme=none,$(s3_mount_opts requests)"
tfs_mount "$OPTS"

head -c "$(((HEAD_MB + REST_MB) << 20))" /dev/urandom >"$T/orig"

# step NAME CMD...: run CMD (bounded), print and return the requests it made in $REQ
step() {
	local name=$1 r0 rc=0
	shift
	r0=$(s3_proxy_count)
	timeout 300 "$@" || rc=$?
	[ $rc -eq 0 ] || fail "$name: status $rc (124: not done in 300 s)"
	REQ=$(($(s3_proxy_count) - r0))
	PUTS=$(($(s3_proxy_count PUT) - PUT0))
	GETS=$(($(s3_proxy_count GET) - GET0))
}
counts0() { PUT0=$(s3_proxy_count PUT); GET0=$(s3_proxy_count GET); }

counts0
step "write ${HEAD_MB} MiB" dd if="$T/orig" of="$MNT/f" bs=1M count=$HEAD_MB conv=fsync status=none
echo "   write ${HEAD_MB} MiB + fsync: $REQ requests ($PUTS PUT)"
counts0
step "write ${REST_MB} MiB more" dd if="$T/orig" of="$MNT/f" bs=1M skip=$HEAD_MB seek=$HEAD_MB \
	conv=fsync,notrunc status=none
objs=$(((REST_MB + OBJ_MB - 1) / OBJ_MB))
echo "   write ${REST_MB} MiB + fsync: $REQ requests ($PUTS PUT; $objs objects of $OBJ_MB MiB hold it)"
[ "$PUTS" -le $((objs + objs / 10 + 1)) ] ||
	fail "$PUTS PUTs for $REST_MB MiB: at most $((objs + objs / 10 + 1)) expected, one per $OBJ_MB MiB object"
WRITE_REQ=$REQ

tfs_umount || fail "tensorfs exited $? after unmount"
sync
echo 3 >/proc/sys/vm/drop_caches
tfs_mount "$OPTS"
counts0
step "read" dd if="$MNT/f" of=/dev/null bs=1M status=none
objs=$((1 + (REST_MB + OBJ_MB - 1) / OBJ_MB))
echo "   read $((HEAD_MB + REST_MB)) MiB: $REQ requests ($GETS GET; $objs objects hold it)"
[ "$GETS" -le $((objs + objs / 10 + 2)) ] ||
	fail "$GETS GETs to read $objs objects: one GET per object expected (at most $((objs + objs / 10 + 2)))"
[ "$(tfs_stat_json tiers s3 read_bytes)" -eq $(((HEAD_MB + REST_MB) << 20)) ] ||
	fail "the s3 tier read $(tfs_stat_json tiers s3 read_bytes) bytes for a $((HEAD_MB + REST_MB)) MiB file"
cmp -s "$T/orig" "$MNT/f" || fail "the file differs after a remount"
tfs_umount || fail "tensorfs exited $? after unmount"
s3_secret_leaks "$LOG" "$S3_PROXY_LOG"

echo "PASS: $((WRITE_REQ * 1024 / REST_MB)) requests per GiB written, $((REQ * 1024 / (HEAD_MB + REST_MB))) per GiB read, through a ${LAT_MS} ms proxy"
exit 0
