#!/bin/bash
# Crash consistency: what was fsynced survives kill -9, and space that was
# allocated but never committed is reclaimed.
#
# First a few "stable" files are written, fsynced and cleanly unmounted; they
# must survive every round. Then, in each of CRASH_ROUNDS rounds (at least 5):
#   - mount; a writer creates files of mixed sizes (some with O_DIRECT, some
#     with zero blocks) and fsyncs about half of them, file then folder. After
#     each fsync returns it appends the name and sha256 to a log outside the
#     mount. Some fsynced files are replaced the way checkpoints are: a new
#     version written to a temporary name, fsynced, renamed over the old one;
#     until the folder fsync returns, either version is accepted;
#   - kill -9 the daemon at a random moment after a few fsyncs;
#   - remount; every logged file must exist with its logged sum, every other
#     file must read without error, and the stable files must be intact;
#   - remove the round's files, unmount cleanly, mount again: nvme0 "used"
#     must be back to what the stable files alone took, within one block.
#
# The random choices come from CRASH_SEED (printed); rerun with it to repeat.

. "$(dirname "$0")/lib.sh"

ROUNDS=${CRASH_ROUNDS:-5}
SEED=${CRASH_SEED:-$((RANDOM << 15 | RANDOM))}
RANDOM=$SEED
echo "crash test seed $SEED, $ROUNDS rounds"
export TFS_DRAM=64M
WRITER_PID=""

# The writing and the check after a crash are the crash matrix's (durable.py).
: "${TFS_SRC:=$(cd "$(dirname "$0")/../.." && pwd)}"
export PYTHONPATH="$TFS_SRC/tests/crash${PYTHONPATH:+:$PYTHONPATH}"

tfs_extra_cleanup() {
	if [ -n "$WRITER_PID" ]; then
		kill "$WRITER_PID" 2>/dev/null
		wait "$WRITER_PID" 2>/dev/null
	fi
}

cat >"$T/crash.py" <<'PY'
"""Writer and verifier for test_crash.sh."""
import hashlib
import os
import random
import sys

from durable import (MiB, check_durable, check_readable, fsync_dir, open_write,
                     write_data)

SIZES = [0, 1, 4095, 4096, 65536 + 3, MiB, MiB + 1, 2 * MiB + 512 * 1024, 3 * MiB]


def content(r, pool, size):
    """Random bytes, cut from a pool at a random place; now and then a zero MiB."""
    out = bytearray()
    while len(out) < size:
        n = min(size - len(out), MiB)
        if n == MiB and r.random() < 0.15:
            out += bytes(MiB)
        else:
            o = r.randrange(len(pool) - n + 1)
            out += pool[o:o + n]
    return bytes(out)


def write_file(path, data, r, direct, sync):
    # O_DIRECT needs aligned sizes: the caller rounds them to 4 KiB
    fd = open_write(path, os.O_CREAT | os.O_TRUNC, direct)
    try:
        write_data(fd, data, r, direct, pieces=(4096, 65536, 300000, MiB, 3 * MiB))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def writer(root, log_path, seed):
    r = random.Random(seed)
    pool = r.randbytes(8 * MiB)
    os.makedirs(root, exist_ok=True)
    fsync_dir(os.path.dirname(root))
    log = open(log_path, "a", buffering=1)
    committed = {}  # name -> (sha, size) of its last durable version
    rel = os.path.basename(root)
    for i in range(100000):
        if committed and r.random() < 0.15:
            # replace a committed file through a temporary name
            name = r.choice(sorted(committed))
            size = r.choice(SIZES[1:])
            data = content(r, pool, size)
            sha = hashlib.sha256(data).hexdigest()
            tmp = os.path.join(root, name + ".tmp")
            write_file(tmp, data, r, False, True)
            log.write(f"R {rel}/{name} {committed[name][0]} {committed[name][1]} {sha} {size}\n")
            os.fsync(log.fileno())
            os.rename(tmp, os.path.join(root, name))
            fsync_dir(root)
            log.write(f"F {rel}/{name} {sha} {size}\n")
            os.fsync(log.fileno())
            committed[name] = (sha, size)
            continue
        size = r.choice(SIZES) if r.random() < 0.6 else r.randrange(6 * MiB)
        direct = r.random() < 0.3
        if direct:
            size = (size + 4095) // 4096 * 4096
        data = content(r, pool, size)
        name = f"f{i:05d}"
        sync = r.random() < 0.5
        write_file(os.path.join(root, name), data, r, direct, sync)
        if sync:
            fsync_dir(root)
            sha = hashlib.sha256(data).hexdigest()
            log.write(f"F {rel}/{name} {sha} {size}\n")
            os.fsync(log.fileno())
            committed[name] = (sha, size)


def verify(mnt, log_path, scan_dir):
    accept = {}
    for line in open(log_path):
        w = line.split()
        if not w:
            continue
        if w[0] == "F":
            accept[w[1]] = {(w[2], int(w[3]))}
        elif w[0] == "R":
            accept[w[1]] = {(w[2], int(w[3])), (w[4], int(w[5]))}
        else:
            # a torn last line, cut by the writer's death: not committed
            continue
    others = set()
    if scan_dir != "-":
        for d, _, files in os.walk(os.path.join(mnt, scan_dir)):
            others |= {os.path.relpath(os.path.join(d, f), mnt) for f in files}
        others -= set(accept)
    lost = check_durable(mnt, accept)
    problems = lost + check_readable(mnt, others)
    for p in problems:
        print(f"CRASH: {p}", file=sys.stderr)
    print(f"   {len(accept) - len(lost)} of {len(accept)} fsynced files intact, "
          f"{len(others)} unsynced files checked")
    sys.exit(1 if problems else 0)


def stable(root, log_path, seed):
    r = random.Random(seed)
    pool = r.randbytes(8 * MiB)
    os.makedirs(root)
    with open(log_path, "w") as log:
        for i, size in enumerate([MiB, 3 * MiB + 5, 1000]):
            data = content(r, pool, size)
            write_file(os.path.join(root, f"s{i}"), data, r, False, True)
            log.write(f"F stable/s{i} {hashlib.sha256(data).hexdigest()} {size}\n")
    fsync_dir(root)


if sys.argv[1] == "writer":
    try:
        writer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    except OSError as err:
        # expected once the daemon is killed; the shell tells the two apart
        print(f"writer stopped: {err}", file=sys.stderr)
        sys.exit(3)
elif sys.argv[1] == "verify":
    verify(sys.argv[2], sys.argv[3], sys.argv[4])
elif sys.argv[1] == "stable":
    stable(sys.argv[2], sys.argv[3], int(sys.argv[4]))
PY

nvme_used() {
	tfs_stat_json tiers nvme0 used || fail "cannot read nvme0 used from stats"
}

# count_fsynced LOG : committed files in a round's log so far
count_fsynced() {
	grep -c '^F ' "$1" 2>/dev/null || true
}

tfs_mount
BLOCK=$(tfs_stat_json block_size) || fail "no block_size in stats"
python3 "$T/crash.py" stable "$MNT/stable" "$T/stable.log" "$SEED" || fail "writing the stable files"
tfs_umount || fail "tensorfs exited $? after unmount"
tfs_mount
python3 "$T/crash.py" verify "$MNT" "$T/stable.log" - || fail "stable files wrong after a clean remount"
BASE_USED=$(nvme_used)
echo "stable files written; nvme0 used $BASE_USED, block size $BLOCK"
tfs_umount || fail "tensorfs exited $? after unmount"

for round in $(seq 1 "$ROUNDS"); do
	rlog="$T/round$round.log"
	: >"$rlog"
	tfs_mount
	python3 "$T/crash.py" writer "$MNT/r$round" "$rlog" "$((SEED * 100 + round))" \
		2>"$T/writer$round.err" &
	WRITER_PID=$!
	# kill at a random moment, once at least 3 files are durable
	for _ in $(seq 1 600); do
		[ "$(count_fsynced "$rlog")" -ge 3 ] && break
		kill -0 "$WRITER_PID" 2>/dev/null || break
		sleep 0.05
	done
	if ! kill -0 "$WRITER_PID" 2>/dev/null; then
		wait "$WRITER_PID"
		fail "round $round: the writer stopped before the crash (exit $?): $(cat "$T/writer$round.err")"
	fi
	[ "$(count_fsynced "$rlog")" -ge 3 ] || fail "round $round: fewer than 3 fsyncs in 30 s"
	delay_ms=$((RANDOM % 1500))
	sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
	kill -0 "$WRITER_PID" 2>/dev/null ||
		fail "round $round: the writer stopped before the crash: $(cat "$T/writer$round.err")"
	tfs_kill9
	# the writer's calls fail once the daemon is gone; give it 20 s to notice
	for _ in $(seq 1 200); do
		kill -0 "$WRITER_PID" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$WRITER_PID" 2>/dev/null && fail "round $round: the writer hangs after the daemon died"
	wait "$WRITER_PID"
	WRITER_PID=""
	echo "round $round: killed after ${delay_ms} ms more, $(count_fsynced "$rlog") files durable"

	tfs_mount
	echo "   remounted: nvme0 used $(nvme_used)"
	python3 "$T/crash.py" verify "$MNT" "$rlog" "r$round" ||
		fail "round $round: fsynced data lost or corrupt after kill -9 (seed $SEED)"
	python3 "$T/crash.py" verify "$MNT" "$T/stable.log" - ||
		fail "round $round: the stable files changed after kill -9 (seed $SEED)"
	[ "$(tfs_stat_json tiers nvme0 errors)" -eq 0 ] || fail "round $round: nvme0 errors in stats"
	rm -rf "${MNT:?}/r$round" || fail "round $round: rm failed"
	sync
	tfs_umount || fail "round $round: tensorfs exited $? after a clean unmount"
	tfs_mount
	used=$(nvme_used)
	echo "   after removing the round's files: nvme0 used $used (stable files alone: $BASE_USED)"
	diff=$((used - BASE_USED))
	[ "${diff#-}" -lt "$BLOCK" ] ||
		fail "round $round: nvme0 used is $used after removing everything but the stable files, which took $BASE_USED: space leaked (seed $SEED)"
	tfs_umount || fail "round $round: tensorfs exited $? after unmount"
done

echo "PASS: $ROUNDS crash rounds, seed $SEED"
exit 0
