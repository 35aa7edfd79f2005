#!/bin/bash
# One user's writers must not hold the mount for the others (issue 37,
# case 7). The rule (docs/security.md): no unprivileged request may hold a
# FUSE worker for long, and no user's writers more than a share of the
# dirty budget. The mount: dram=128M, threads=16, nvme_bw=20M, allow_other;
# 40 writers as nobody write distinct 1 MiB blocks as fast as they can (each
# over the first 16 MiB of its own file, again and again), so the dirty
# budget stays full and write-back runs at the cap.
#
#   1. While they flood, root's stat of a file, read (O_DIRECT, so that the
#      daemon serves it) of a 1 MiB file pinned in DRAM, and ls answer in 5
#      samples 1.1 s apart (past the kernel's 1 s attribute and name
#      caches): each one's median within 1 s, and every sample within 5 s.
#      Unloaded they take about 0.02 s, and about as much with this fix
#      under the flood; on 2582941 they took 0.4 to 2.5 s each on a quiet
#      2-core machine, ls never less than 1 s and often more than 10 (6 to
#      15 s in the issue), since 16 writers waiting for room held all 16
#      workers and every request queued behind the other writers' ones. The
#      bounds are seconds, not the issue's 100 ms, and on medians, so that
#      a loaded shared machine (a load of 18 on 2 cores made one read take
#      1.4 s once) does not fail it; the times are printed.
#   2. With nobody's writers holding the dirty budget, root writes 8 MiB to
#      a new file within 10 s (at the cap that is about 0.5 s of write-back)
#      and reads it back right.
#   3. The writers stop on SIGTERM (the one in flight ends first; a write
#      interrupted while parked is answered EINTR and written again), and
#      every block of 4 of their files holds its last write, whole: the
#      bytes of writes parked off the workers land where they belong.
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
command -v setpriv >/dev/null || skip "no setpriv"
chmod 755 "$T" # so that nobody can reach the mount point

export TFS_DRAM=128M TFS_THREADS=16
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
WRITERS=40
WRAP=16     # blocks each writer writes over, again and again
BOUND_MS=1000 # each request's median of 5 samples
MAX_MS=5000   # each sample
PYTHON=$(command -v python3)
"${NOBODY[@]}" "$PYTHON" -c '' 2>/dev/null || PYTHON=/usr/bin/python3
"${NOBODY[@]}" "$PYTHON" -c '' 2>/dev/null || skip "no python3 that nobody may run"

PIDS=()
tfs_extra_cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill -9 "$p" 2>/dev/null
	done
}

# The writer: block k at (k % WRAP) MiB, its first 16 bytes (writer, k),
# the rest the writer's own bytes (seeded by its number), until SIGTERM;
# then it prints how many it wrote.
cat >"$T/writer.py" <<'PY'
import os, random, signal, struct, sys
path, me, wrap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
stop = False
def on_term(sig, frame):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
buf = bytearray(random.Random(me).randbytes(1 << 20))
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
k = 0
while not stop:
    struct.pack_into("<QQ", buf, 0, me, k)
    os.pwrite(fd, buf, (k % wrap) << 20)  # retried on EINTR (PEP 475)
    k += 1
os.close(fd)
print(k)
PY

# ms VAR CMD...: run CMD within 10 s and set VAR to the milliseconds it
# took (timed around CMD alone: within's polling is coarser); fail if it
# fails. Not in $(...): a CMD that never answers would hold its pipe.
ms() {
	local var=$1
	shift
	rm -f "$T/ms.out"
	within 10 bash -c 't0=$(date +%s%N); "${@:2}" >/dev/null 2>&1 || exit 1
		echo $((($(date +%s%N) - t0) / 1000000)) >"$1"' ms "$T/ms.out" "$@" ||
		fail "'$*' failed or did not answer within 10 s"
	printf -v "$var" %s "$(cat "$T/ms.out")"
}

tfs_mount "nvme_bw=20M,allow_other"
mkdir -m 1777 "$MNT/pub" && mkdir "$MNT/st" "$MNT/ls" || fail "mkdir"
for i in 1 2 3 4 5; do
	: >"$MNT/st/f$i" || fail "creating st/f$i"
done
for i in $(seq 1 50); do
	: >"$MNT/ls/f$i" || fail "creating ls/f$i"
done
head -c $((1 << 20)) /dev/urandom >"$T/res.ref"
cp "$T/res.ref" "$MNT/res" || fail "writing res"
within 20 "$TFSCTL" -m "$MNT" pin "$MNT/res" >"$T/pin.out" 2>&1 || fail "pin: $(cat "$T/pin.out")"

echo "1. $WRITERS writers as nobody; root's stat, read of a pinned file and ls"
for i in $(seq 1 $WRITERS); do
	"${NOBODY[@]}" "$PYTHON" "$T/writer.py" "$MNT/pub/w$i" "$i" $WRAP >"$T/w$i.out" 2>&1 &
	PIDS+=($!)
done
# Until the dirty budget is full, and 3 s more for the queue of writes to build.
for i in $(seq 1 300); do
	d=$(tfs_stat_json cache dirty_bytes) && l=$(tfs_stat_json cache dirty_limit_bytes) ||
		fail "reading stats"
	[ "$d" -ge $((l - (4 << 20))) ] && break
	sleep 0.1
done
[ "$d" -ge $((l - (4 << 20))) ] || fail "the writers did not fill the dirty budget in 30 s ($d of $l)"
sleep 3
stats=() reads=() lss=()
for s in 1 2 3 4 5; do
	sleep 1.1
	ms a stat "$MNT/st/f$s"
	ms b dd if="$MNT/res" of="$T/res.out" bs=1M iflag=direct
	cmp -s "$T/res.out" "$T/res.ref" || fail "the pinned file read back wrong"
	ms c ls -l "$MNT/ls"
	echo "   sample $s: stat $a ms, read $b ms, ls $c ms"
	stats+=("$a") reads+=("$b") lss+=("$c")
done
# bounded NAME MS...: the median within BOUND_MS, every one within MAX_MS.
bounded() {
	local name=$1 med
	shift
	med=$(printf '%s\n' "$@" | sort -n | sed -n 3p)
	[ "$med" -le $BOUND_MS ] ||
		fail "root's $name took $med ms (median) while nobody's writers flood; want under $BOUND_MS ms"
	for v in "$@"; do
		[ "$v" -le $MAX_MS ] || fail "root's $name took $v ms once; want under $MAX_MS ms"
	done
}
bounded stat "${stats[@]}"
bounded read "${reads[@]}"
bounded ls "${lss[@]}"
for p in "${PIDS[@]}"; do
	alive "$p" || fail "a writer ended early: $(cat "$T"/w*.out)"
done

echo "2. root writes 8 MiB to a new file while nobody holds the dirty budget"
head -c $((8 << 20)) /dev/urandom >"$T/new.ref"
t0=$(date +%s%N)
within 10 "$PYTHON" -c '
import os, sys
data = open(sys.argv[1], "rb").read()
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
for off in range(0, len(data), 1 << 20):
    os.pwrite(fd, data[off:off + (1 << 20)], off)
os.close(fd)' "$T/new.ref" "$MNT/new" || fail "root's 8 MiB did not go in within 10 s"
t1=$(date +%s%N)
echo "   in $(((t1 - t0) / 1000000)) ms"
within 30 dd if="$MNT/new" of="$T/new.out" bs=1M iflag=direct status=none || fail "reading new"
cmp -s "$T/new.out" "$T/new.ref" || fail "root's new file read back wrong"
echo "   parked writes so far: $(tfs_stat_json fuse write_parked)"

echo "3. the writers stop; their last writes are whole and in place"
for p in "${PIDS[@]}"; do
	kill -TERM "$p"
done
for i in "${!PIDS[@]}"; do
	waitfor "${PIDS[$i]}" 30 || fail "writer $((i + 1)) did not stop within 30 s of SIGTERM"
done
PIDS=()
within 60 "$PYTHON" - "$MNT/pub" "$T" $WRAP <<'PY' >"$T/verify.out" 2>&1 || fail "$(cat "$T/verify.out")"
import mmap, os, random, struct, sys
pub, t, wrap = sys.argv[1], sys.argv[2], int(sys.argv[3])
buf = mmap.mmap(-1, 1 << 20)  # aligned, for O_DIRECT
for me in (1, 14, 27, 40):
    n = int(open(f"{t}/w{me}.out").read())
    want = bytearray(random.Random(me).randbytes(1 << 20))
    fd = os.open(f"{pub}/w{me}", os.O_RDONLY | os.O_DIRECT)
    for pos in range(min(n, wrap)):
        last = max(k for k in range(n) if k % wrap == pos)
        struct.pack_into("<QQ", want, 0, me, last)
        if os.preadv(fd, [buf], pos << 20) != 1 << 20 or buf[:] != want:
            got = struct.unpack_from("<QQ", buf, 0)
            sys.exit(f"writer {me}, block {pos}: want write {last} of {n}, got {got}")
    os.close(fd)
print("ok")
PY
echo "   4 files of $WRITERS hold every last write"
tfs_umount || fail "unmount"
echo PASS
