#!/bin/bash
# Mount test: a full nvme tier gives ENOSPC to the writer, loses nothing
# that was reported durable, and works again once space is freed.
#
# The nvme folder is a 64 MiB tmpfs, the DRAM tier 256 MiB, so the cache
# alone could swallow every write. Files of 4 MiB are written in 1 MiB
# write() calls and fsynced, first buffered, then with O_DIRECT, until a
# call fails. The failure must be ENOSPC and reach the writer: write(),
# fsync() or close(). No write may return a short count. Every file whose
# fsync succeeded must read back byte for byte, before and after a remount,
# and after two files are deleted a new 4 MiB file must fit again.

. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null 2>&1 || skip "python3 not found"

SMALL="$T/small"
mkdir -p "$SMALL"
mount -t tmpfs -o size=64m tmpfs "$SMALL" 2>/dev/null || skip "cannot mount a tmpfs (needs root)"
tfs_extra_cleanup() {
	is_mounted "$SMALL" && { umount "$SMALL" 2>/dev/null || umount -l "$SMALL"; }
	true
}
NVME="$SMALL"
export TFS_DRAM=256M

cat >"$T/enospc.py" <<'PY'
import errno, hashlib, json, mmap, os, random, sys, time

MODE, MNT, STATE = sys.argv[1:4]
MiB = 1 << 20
CHUNK, FILE = MiB, 4 * MiB
LIMIT = 192 * MiB           # three times the tier: ENOSPC must come first
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("  not ok:", msg, file=sys.stderr)
    return cond


def ename(e):
    return errno.errorcode.get(e, str(e))


def chunk(seed, i):
    return random.Random(seed * 1000003 + i).randbytes(CHUNK)


def expected(f):
    h = hashlib.sha256()
    for i in range(f["chunks"]):
        h.update(chunk(f["seed"], i))
    return h.hexdigest()


def read_direct(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, CHUNK)
    h, n_total = hashlib.sha256(), 0
    try:
        while True:
            n = os.readv(fd, [buf])
            if n == 0:
                break
            h.update(buf[:n])
            n_total += n
    finally:
        os.close(fd)
        buf.close()
    return h.hexdigest(), n_total


def verify(files, when):
    for f in files:
        path = os.path.join(MNT, f["name"])
        size = f["chunks"] * CHUNK
        try:
            st = os.stat(path)
            digest, n = read_direct(path)
        except OSError as e:
            check(False, f"{when}: {f['name']}: {e}")
            continue
        check(st.st_size == size, f"{when}: {f['name']} size {st.st_size}, want {size}")
        check(n == size and digest == expected(f),
              f"{when}: {f['name']} reads back {n} bytes, wrong content"
              if n == size else f"{when}: {f['name']} reads back {n} of {size} bytes")


seeds = iter(range(1, 1 << 30))


def write_file(name, direct, chunks):
    """Write chunks x 1 MiB, fsync, close. Returns (file record or None,
    errno or None, where it failed)."""
    seed = next(seeds)
    path = os.path.join(MNT, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o644)
    buf = mmap.mmap(-1, CHUNK)           # aligned, for O_DIRECT
    written, err, where = 0, None, None
    for i in range(chunks):
        data = chunk(seed, i)
        try:
            if direct:
                buf[:] = data
                n = os.write(fd, buf)
            else:
                n = os.write(fd, data)
        except OSError as e:
            err, where = e.errno, f"write of chunk {i}"
            break
        if not check(n == CHUNK, f"{name}: write of chunk {i} returned {n} "
                     f"of {CHUNK} bytes: a short write"):
            err, where = "short", f"write of chunk {i}"
            break
        written += 1
    buf.close()
    synced = True
    try:
        os.fsync(fd)
    except OSError as e:
        synced = False
        if err is None:
            err, where = e.errno, "fsync"
        else:
            check(e.errno == errno.ENOSPC,
                  f"{name}: fsync after failed write: {ename(e.errno)}")
    try:
        os.close(fd)
    except OSError as e:
        if err is None:
            err, where = e.errno, "close"
            synced = False
    if synced and written > 0 and err != "short":
        return {"name": name, "seed": seed, "chunks": written}, err, where
    os.unlink(path)                      # content not promised: drop it
    return None, err, where


def fill(tag, direct):
    """Write files until a call fails. Returns the durable files."""
    files = []
    for k in range(LIMIT // FILE):
        rec, err, where = write_file(f"{tag}{k:03d}", direct, FILE // CHUNK)
        if rec:
            files.append(rec)
        if err is not None:
            check(err == errno.ENOSPC,
                  f"{tag}{k:03d}: {where} failed with {err if err == 'short' else ename(err)}, "
                  f"want ENOSPC")
            print(f"  {tag}: {ename(err) if err != 'short' else err} at {where} of "
                  f"{tag}{k:03d}, {sum(f['chunks'] for f in files)} MiB durable",
                  file=sys.stderr)
            return files
    check(False, f"{tag}: no error after writing {LIMIT >> 20} MiB to a 64 MiB tier")
    return files


def free_and_write(files, tag, direct):
    """Delete two files, then a new 4 MiB file must fit. Space may take a
    moment to come back: retry, bounded."""
    for f in files[:2]:
        os.unlink(os.path.join(MNT, f["name"]))
    del files[:2]
    last = None
    for attempt in range(150):
        rec, err, where = write_file(f"{tag}{attempt:03d}", direct, FILE // CHUNK)
        if err is None and rec:
            files.append(rec)
            return
        if rec:
            os.unlink(os.path.join(MNT, rec["name"]))
        last = f"{where}: {err if err == 'short' else ename(err)}"
        if err != errno.ENOSPC:
            break
        time.sleep(0.1)
    check(False, f"{tag}: a 4 MiB file still does not fit after freeing 8 MiB ({last})")


if MODE == "fill":
    files = fill("buf", direct=False)
    verify(files, "after buffered fill")
    free_and_write(files, "buf-again", direct=False)
    files += fill("dio", direct=True)
    verify(files, "after O_DIRECT fill")
    free_and_write(files, "dio-again", direct=True)
    verify(files, "after freeing space")
    with open(STATE, "w") as f:
        json.dump(files, f)
else:
    with open(STATE) as f:
        files = json.load(f)
    names = sorted(os.listdir(MNT))
    check(names == sorted(f["name"] for f in files),
          f"after remount the folder holds {names}, want {sorted(f['name'] for f in files)}")
    verify(files, "after remount")

if failures:
    print(f"{len(failures)} checks failed in {MODE}", file=sys.stderr)
    sys.exit(1)
PY

tfs_mount
timeout -k 10 200 python3 "$T/enospc.py" fill "$MNT" "$T/files.json" ||
	fail "ENOSPC checks failed (see above)"
tfs_umount || fail "tensorfs -f exited non-zero after unmount"
tfs_mount
timeout -k 10 60 python3 "$T/enospc.py" verify "$MNT" "$T/files.json" ||
	fail "surviving files are wrong after remount (see above)"
tfs_umount || fail "tensorfs -f exited non-zero after unmount"
exit 0
