#!/bin/bash
# The S3 server dies in the middle of a write workload and comes back.
#
# nvme and s3 together, remote_timeout=5. Files written and fsynced before
# the outage have blocks on both tiers. A writer keeps writing and fsyncing
# files while s3rver is killed (SIGKILL) and while it is down. Checked:
#   - writes go on: no write or fsync fails, files are committed while s3 is
#     down, and their blocks go to nvme;
#   - reads of blocks that live on s3 fail with EIO, within a bound set by
#     remote_timeout, never hang, and other blocks read fine; the daemon log
#     says which device failed and why; tiers.s3.state is "down";
#   - s3rver starts again on the same port over the same data: the tier is
#     "up" again within a few probe intervals and takes new blocks;
#   - after a remount, every committed file reads back intact.

. "$(dirname "$0")/lib_s3.sh"

TIMEOUT=5
READ_BOUND=$((3 * TIMEOUT + 5)) # a read may wait for a connection, then for its own deadline
WRITER_PID=""
export TFS_DRAM=128M TFS_THREADS=8

s3_test_cleanup() {
	if [ -n "$WRITER_PID" ]; then
		kill "$WRITER_PID" 2>/dev/null
		wait "$WRITER_PID" 2>/dev/null
	fi
}

stat_tier() {
	tfs_stat_json tiers "$1" "$2"
}

# wait_state STATE SECONDS: until tiers.s3.state is STATE.
wait_state() {
	for _ in $(seq 1 $(($2 * 10))); do
		[ "$(stat_tier s3 state)" = "$1" ] && return 0
		sleep 0.1
	done
	fail "tiers.s3.state is $(stat_tier s3 state), not $1, after $2 s"
}

s3_start
# nvme capped so that s3 takes a fair share of the blocks.
OPTS="$(s3_mount_opts outage),remote_timeout=$TIMEOUT,nvme_bw=200M"
tfs_mount "$OPTS"

# Before the outage: 16 blocks in two files, on both tiers.
mkdir -p "$T/orig"
for f in a0 a1; do
	head -c 8M /dev/urandom >"$T/orig/$f"
	dd if="$T/orig/$f" of="$MNT/$f" bs=1M conv=fsync status=none || fail "write $f"
done
[ "$(stat_tier s3 used)" -gt 0 ] || fail "no block went to s3 before the outage"
[ "$(stat_tier nvme0 used)" -gt 0 ] || fail "no block went to nvme before the outage"
echo "   before: s3 holds $(($(stat_tier s3 used) >> 20)) MiB, nvme0 $(($(stat_tier nvme0 used) >> 20)) MiB"
tfs_umount || fail "tensorfs exited $? after unmount"
tfs_mount "$OPTS" # nothing cached

# The writer: 4 MiB files, each fsynced; a line per committed file.
python3 - "$MNT" "$T/committed" "$T/writer.err" "$T/stop" <<'PY' &
import hashlib, os, sys, time
mnt, committed, errs, stop = sys.argv[1:]
i = 0
with open(committed, "a") as log:
    while not os.path.exists(stop):
        data = os.urandom(4 << 20)
        name = "w%04d" % i
        try:
            fd = os.open(os.path.join(mnt, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            with open(errs, "a") as f:
                f.write("%s: %s\n" % (name, e))
            break
        log.write("%s %s %.3f\n" % (name, hashlib.sha256(data).hexdigest(), time.time()))
        log.flush()
        i += 1
        time.sleep(0.05)
PY
WRITER_PID=$!

# wait_committed N: until the writer has committed N files (bounded, 30 s).
wait_committed() {
	local i
	for i in $(seq 1 300); do
		[ "$(wc -l <"$T/committed")" -ge "$1" ] && return 0
		[ -s "$T/writer.err" ] && fail "the writer failed: $(cat "$T/writer.err")"
		sleep 0.1
	done
	fail "the writer committed fewer than $1 files in 30 s"
}
wait_committed 10
s3_kill
echo "   s3rver killed after $(wc -l <"$T/committed") committed files"

# Reads while s3 is down: each block of a0 and a1 at once, one thread each.
python3 - "$MNT" "$T/orig" "$READ_BOUND" >"$T/reads" <<'PY' || fail "reads while s3 was down: $(cat "$T/reads")"
import errno, os, sys, threading, time
mnt, orig, bound = sys.argv[1], sys.argv[2], float(sys.argv[3])
bs = 1 << 20
results = []
def read_block(name, i):
    want = open(os.path.join(orig, name), "rb").read()[i * bs:(i + 1) * bs]
    t0 = time.time()
    try:
        fd = os.open(os.path.join(mnt, name), os.O_RDONLY)
        try:
            got = os.pread(fd, bs, i * bs)
        finally:
            os.close(fd)
        res = "ok" if got == want else "WRONG DATA"
    except OSError as e:
        res = errno.errorcode.get(e.errno, str(e.errno))
    results.append((name, i, res, time.time() - t0))
threads = [threading.Thread(target=read_block, args=(n, i), daemon=True)
           for n in ("a0", "a1") for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join(bound + 30)
if len(results) != len(threads):
    print("%d reads hung" % (len(threads) - len(results)))
    sys.exit(1)
bad = [r for r in results if r[2] not in ("ok", "EIO") or r[3] > bound]
eio = [r for r in results if r[2] == "EIO"]
slowest = max(r[3] for r in results)
print("%d blocks read, %d EIO, slowest %.1f s" % (len(results), len(eio), slowest))
for r in bad:
    print("block %d of %s: %s after %.1f s" % (r[1], r[0], r[2], r[3]))
sys.exit(1 if bad or not eio else 0)
PY
echo "   reads while down: $(cat "$T/reads")"
wait_state down 10
[ "$(stat_tier s3 errors)" -gt 0 ] || fail "s3 counts no errors while down"
grep -q "s3 (.*): down" "$LOG" || fail "the log does not say that s3 went down"
grep -q "s3: GET of slot [0-9]* failed after .*onnect" "$LOG" ||
	fail "the log does not say why reads from s3 failed"

# Writes go on while s3 is down, and land on nvme.
S3_WB=$(stat_tier s3 write_bytes)
NVME_WB=$(stat_tier nvme0 write_bytes)
N_DOWN=$(wc -l <"$T/committed")
wait_committed $((N_DOWN + 10))
[ -s "$T/writer.err" ] && fail "the writer failed while s3 was down: $(cat "$T/writer.err")"
[ "$(wc -l <"$T/committed")" -gt "$N_DOWN" ] || fail "no file was committed while s3 was down"
[ "$(stat_tier nvme0 write_bytes)" -gt "$NVME_WB" ] || fail "nvme0 took no writes while s3 was down"
[ "$(stat_tier s3 write_bytes)" -eq "$S3_WB" ] || fail "s3 counted writes while down"
echo "   while down: $(($(wc -l <"$T/committed") - N_DOWN)) files committed," \
	"all on nvme0"

# s3rver comes back on the same port over the same data.
s3_start
UP_START=$(date +%s)
wait_state up 15
echo "   s3 up again $(($(date +%s) - UP_START)) s after s3rver restarted"
grep -q "s3 (.*): up again" "$LOG" || fail "the log does not say that s3 is up again"
S3_WB=$(stat_tier s3 write_bytes)
N_UP=$(wc -l <"$T/committed")
for _ in $(seq 1 100); do
	[ "$(stat_tier s3 write_bytes)" -gt "$S3_WB" ] && break
	sleep 0.1
done
[ "$(stat_tier s3 write_bytes)" -gt "$S3_WB" ] || fail "s3 takes no new blocks after it came back"
wait_committed $((N_UP + 5))
touch "$T/stop"
wait "$WRITER_PID" || fail "the writer exited $?"
WRITER_PID=""
[ -s "$T/writer.err" ] && fail "the writer failed: $(cat "$T/writer.err")"
[ "$(wc -l <"$T/committed")" -gt "$N_UP" ] || fail "no file was committed after s3 came back"

# Everything committed reads back, from both tiers, after a remount.
tfs_umount || fail "tensorfs exited $? after unmount"
tfs_mount "$OPTS"
for f in a0 a1; do
	cmp -s "$T/orig/$f" "$MNT/$f" || fail "$f differs after the outage"
done
while read -r name sum _; do
	[ "$(sha256sum <"$MNT/$name" | cut -d' ' -f1)" = "$sum" ] || fail "$name differs after the outage"
done <"$T/committed"
[ "$(stat_tier s3 read_bytes)" -gt 0 ] || fail "nothing was read back from s3"
[ "$(stat_tier s3 errors)" -eq 0 ] || fail "s3 errors after the outage"
echo "   $(wc -l <"$T/committed") committed files and a0, a1 read back intact;" \
	"s3 read $(($(stat_tier s3 read_bytes) >> 20)) MiB"
tfs_umount || fail "tensorfs exited $? after unmount"
s3_secret_leaks "$LOG"

echo "PASS: s3 outage: writes go on to nvme, s3 reads fail with EIO in time, the tier comes back"
exit 0
