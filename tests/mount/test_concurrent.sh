#!/bin/bash
# Many writers and readers at once, with DRAM far smaller than the data.
#
# Six writer processes each write twelve files of 4 to 16 MiB, each in its
# own way:
#   w0, w1  buffered, sequential, odd request sizes;
#   w2, w3  O_DIRECT, 4 threads, each writing its slice of the file in 1 MiB
#           requests from a 1 KiB aligned start (DeepSpeed's intra-op
#           parallelism);
#   w4      O_DIRECT, 1 MiB requests in random order;
#   w5      buffered pwrite of odd sizes in random order.
# Then each writer overwrites half of its files in place with new contents of
# the same size, as the optimizer does from its second iteration on.
#
# Three readers (two buffered, one O_DIRECT) keep re-reading files that are
# complete while the writers go on. A writer logs "B name" before it touches a
# file and "F name sha256 size" once the file is closed; a reader checks a
# sum only if no new line for that file appeared while it read.
#
# At the end every file must match its sum, again after an unmount and a
# remount, and the cache must have evicted.

. "$(dirname "$0")/lib.sh"

SEED=${CONC_SEED:-$((RANDOM << 15 | RANDOM))}
WRITERS=6
FILES=${CONC_FILES:-12}
echo "concurrent test seed $SEED: $WRITERS writers x $FILES files, 3 readers"
export TFS_DRAM=64M
PIDS=()

tfs_extra_cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
}

# conc.py reads files as the crash tests do (tests/crash/durable.py).
export PYTHONPATH="$TFS_SRC/tests/crash${PYTHONPATH:+:$PYTHONPATH}"
cat >"$T/conc.py" <<'PY'
"""Writers, readers and the final check for test_concurrent.sh."""
import hashlib
import mmap
import os
import random
import sys
import threading
import time

import durable

MiB = 1 << 20
KiB = 1 << 10


class Manifest:
    """A writer's log: B NAME before touching a file, F NAME SHA SIZE after."""

    def __init__(self, path):
        self.f = open(path, "a", buffering=1)

    def begin(self, name):
        self.f.write(f"B {name}\n")
        self.f.flush()

    def done(self, name, data):
        self.f.write(f"F {name} {hashlib.sha256(data).hexdigest()} {len(data)}\n")
        self.f.flush()


def read_manifests(paths):
    """name -> (number of lines about it, last line's words)."""
    state = {}
    for p in paths:
        try:
            lines = open(p).read().split("\n")
        except FileNotFoundError:
            continue
        for line in lines[:-1]:  # the last piece may be a line being written
            w = line.split()
            n, _ = state.get(w[1], (0, None))
            state[w[1]] = (n + 1, w)
    return state


def gen(r, pool, size):
    out = bytearray()
    while len(out) < size:
        n = min(size - len(out), MiB)
        o = r.randrange(len(pool) - n + 1)
        out += pool[o:o + n]
    return bytes(out)


def full_write(fd, data, off):
    n = os.pwrite(fd, data, off)
    if n != len(data):
        raise SystemExit(f"short write: {n} of {len(data)} at {off}")


def direct_write(fd, data, off, buf):
    buf[:len(data)] = data
    n = os.pwritev(fd, [memoryview(buf)[:len(data)]], off)
    if n != len(data):
        raise SystemExit(f"short O_DIRECT write: {n} of {len(data)} at {off}")


def write_seq(path, data, r):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        pos = 0
        while pos < len(data):
            n = r.choice([4096, 65536 + 17, 777777, MiB, 2 * MiB + 3])
            full_write(fd, data[pos:pos + n], pos)
            pos += n
    finally:
        os.close(fd)


def write_random_buffered(path, data, r):
    pieces = []
    pos = 0
    while pos < len(data):
        n = r.choice([1000, 4096, 100003, MiB + 5])
        pieces.append((pos, min(n, len(data) - pos)))
        pos += n
    r.shuffle(pieces)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for off, n in pieces:
            full_write(fd, data[off:off + n], off)
    finally:
        os.close(fd)


def write_direct_random(path, data, r):
    offs = list(range(0, len(data), MiB))
    r.shuffle(offs)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    buf = mmap.mmap(-1, MiB)
    try:
        for off in offs:
            direct_write(fd, data[off:off + MiB], off, buf)
    finally:
        os.close(fd)
        buf.close()


def write_direct_threads(path, data, r, nthreads=4):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    errors = []

    def slice_writer(t):
        buf = mmap.mmap(-1, MiB)
        try:
            lo, hi = t * len(data) // nthreads, (t + 1) * len(data) // nthreads
            for off in range(lo, hi, MiB):
                direct_write(fd, data[off:min(off + MiB, hi)], off, buf)
        except BaseException as err:  # reported by the main thread
            errors.append(err)
        finally:
            buf.close()

    threads = [threading.Thread(target=slice_writer, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.close(fd)
    if errors:
        raise SystemExit(f"{path}: {errors[0]}")


WAYS = [write_seq, write_seq, write_direct_threads, write_direct_threads,
        write_direct_random, write_random_buffered]


def writer(mnt, manifest_path, wid, nfiles, seed):
    r = random.Random(seed)
    pool = r.randbytes(18 * MiB)
    way = WAYS[wid]
    direct = way in (write_direct_threads, write_direct_random)
    m = Manifest(manifest_path)
    sizes = {}
    for i in range(nfiles):
        size = r.randrange(4 * MiB, 16 * MiB + 1)
        if direct:
            size = size // (4 * KiB) * (4 * KiB)  # DeepSpeed rounds to 1 KiB x threads
        name = f"w{wid}-{i:02d}"
        sizes[name] = size
        data = gen(r, pool, size)
        m.begin(name)
        way(os.path.join(mnt, name), data, r)
        m.done(name, data)
    for name in sorted(sizes)[::2]:
        data = gen(r, pool, sizes[name])
        m.begin(name)
        way(os.path.join(mnt, name), data, r)
        m.done(name, data)


def file_sum(path, direct):
    if not direct:
        return durable.file_sum(path)
    h = hashlib.sha256()
    n = 0
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, MiB)
    try:
        while True:
            k = os.preadv(fd, [buf], n)
            if k == 0:
                break
            h.update(memoryview(buf)[:k])
            n += k
    finally:
        os.close(fd)
        buf.close()
    return h.hexdigest(), n


def reader(mnt, manifests, done_flag, rid, direct):
    r = random.Random(rid)
    checked = 0
    while True:
        finished = os.path.exists(done_flag)
        before = read_manifests(manifests)
        ready = sorted(n for n, (_, w) in before.items() if w[0] == "F")
        if ready:
            name = r.choice(ready)
            got = file_sum(os.path.join(mnt, name), direct)
            after = read_manifests(manifests)
            if after[name][0] == before[name][0]:
                w = before[name][1]
                if got != (w[2], int(w[3])):
                    raise SystemExit(f"reader {rid}: {name}: read sha256 {got[0]} size {got[1]}, "
                                     f"expected {w[2]} size {w[3]}")
                checked += 1
        else:
            time.sleep(0.05)
        if finished:
            break
    print(f"   reader {rid}{' (O_DIRECT)' if direct else ''}: {checked} files checked "
          "while written")
    if checked == 0:
        raise SystemExit(f"reader {rid} checked no file")


def check(mnt, manifests, nfiles):
    state = read_manifests(manifests)
    bad = 0
    for name, (_, w) in sorted(state.items()):
        if w[0] != "F":
            print(f"{name}: never finished", file=sys.stderr)
            bad += 1
            continue
        for direct in (False, True):
            got = file_sum(os.path.join(mnt, name), direct)
            if got != (w[2], int(w[3])):
                print(f"{name}{' (O_DIRECT)' if direct else ''}: sha256 {got[0]} size {got[1]}, "
                      f"expected {w[2]} size {w[3]}", file=sys.stderr)
                bad += 1
    names = sorted(n for n in os.listdir(mnt))
    if names != sorted(state) or len(names) != len(manifests) * nfiles:
        print(f"the folder holds {len(names)} files, expected {len(manifests) * nfiles}",
              file=sys.stderr)
        bad += 1
    print(f"   {len(state) - bad} of {len(state)} files match, buffered and O_DIRECT")
    sys.exit(1 if bad else 0)


cmd = sys.argv[1]
if cmd == "writer":
    writer(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
elif cmd == "reader":
    reader(sys.argv[2], sys.argv[3].split(","), sys.argv[4], int(sys.argv[5]),
           sys.argv[6] == "direct")
elif cmd == "check":
    check(sys.argv[2], sys.argv[3].split(","), int(sys.argv[4]))
PY

MANIFESTS=""
for w in $(seq 0 $((WRITERS - 1))); do
	MANIFESTS="$MANIFESTS${MANIFESTS:+,}$T/manifest$w"
done
DATA="$MNT/data"

tfs_mount
mkdir "$DATA" || fail "mkdir $DATA"
for w in $(seq 0 $((WRITERS - 1))); do
	python3 "$T/conc.py" writer "$DATA" "$T/manifest$w" "$w" "$FILES" "$((SEED + w))" &
	PIDS+=($!)
done
WRITER_PIDS=("${PIDS[@]}")
READER_PIDS=()
for r in 0 1 2; do
	mode=buffered
	[ $r -eq 2 ] && mode=direct
	python3 "$T/conc.py" reader "$DATA" "$MANIFESTS" "$T/writers-done" "$r" $mode &
	PIDS+=($!)
	READER_PIDS+=($!)
done
for i in "${!WRITER_PIDS[@]}"; do
	wait "${WRITER_PIDS[$i]}" || fail "writer w$i failed (exit $?), seed $SEED"
done
touch "$T/writers-done"
for p in "${READER_PIDS[@]}"; do
	wait "$p" || fail "a reader failed (exit $?), seed $SEED"
done
PIDS=()
echo "   writers and readers done; cache evictions $(tfs_stat_json cache evictions)," \
	"nvme0 read_bytes $(tfs_stat_json tiers nvme0 read_bytes)"
[ "$(tfs_stat_json cache evictions)" -gt 0 ] ||
	fail "no eviction with $TFS_DRAM of DRAM under ~700 MiB of data"
python3 "$T/conc.py" check "$DATA" "$MANIFESTS" "$FILES" ||
	fail "files wrong after the concurrent run, seed $SEED"
[ "$(tfs_stat_json tiers nvme0 errors)" -eq 0 ] || fail "nvme0 errors in stats"
tfs_umount || fail "tensorfs exited $? after unmount"

TFS_DRAM=128M tfs_mount
python3 "$T/conc.py" check "$DATA" "$MANIFESTS" "$FILES" ||
	fail "files wrong after remount, seed $SEED"
tfs_umount || fail "tensorfs exited $? after unmount"

echo "PASS: concurrent writers and readers, seed $SEED"
exit 0
