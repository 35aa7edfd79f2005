#!/bin/bash
# Mount test: a full nvme tier gives ENOSPC to the writer, loses nothing
# that was reported durable, and works again once space is freed.
#
# The nvme folder is a 64 MiB tmpfs, the DRAM tier 256 MiB, so the cache
# alone could swallow every write. Files of 4 MiB are written in 1 MiB
# write() calls and fsynced, first buffered (each write straddling two
# blocks), then with O_DIRECT, until a call fails. The failure must be
# ENOSPC and reach the writer: write(), fsync() or close(). No write may
# return a short count, and a write that fails must not change the file
# (no partial size). Every file whose fsync succeeded must read back byte
# for byte, before and after a remount, and after files are deleted a new
# 4 MiB file must fit again. Each fill must also store a fair share of the
# tier before it gives up. A last fill writes as the offloader does,
# O_DIRECT at 1 KiB offsets and never fsync: ENOSPC must come from write()
# or close(), and every file they accepted must read back after the
# unmount wrote it back. Then the same offloader's fill with two nvme
# folders on that one tmpfs: its space counts once.

. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null 2>&1 || skip "python3 not found"

SMALL="$T/small"
mkdir -p "$SMALL"
# mode=0700: a tmpfs is 1777 otherwise, and an nvme folder others can write is refused.
mount -t tmpfs -o size=64m,mode=0700 tmpfs "$SMALL" 2>/dev/null || skip "cannot mount a tmpfs (needs root)"
tfs_extra_cleanup() {
	is_mounted "$SMALL" && { umount "$SMALL" 2>/dev/null || umount -l "$SMALL"; }
	true
}
NVME="$SMALL"
export TFS_DRAM=256M

# check, ename, failures: tests/mount/checks.py
export PYTHONPATH="$TFS_SRC/tests/mount${PYTHONPATH:+:$PYTHONPATH}"
cat >"$T/enospc.py" <<'PY'
import errno, hashlib, json, mmap, os, random, sys, time

from checks import check, ename, failures

MODE, MNT, STATE = sys.argv[1:4]
MiB = 1 << 20
CHUNK, FILE = MiB, 4 * MiB
LIMIT = 192 * MiB           # three times the tier: ENOSPC must come first


def chunk(seed, i):
    return random.Random(seed * 1000003 + i).randbytes(CHUNK)


def expected(f):
    h = hashlib.sha256(bytes(f["off"]))
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
        size = f["off"] + f["chunks"] * CHUNK
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


def write_file(name, direct, chunks, sync=True, off=0):
    """Write chunks x 1 MiB from offset off (a hole before it), fsync (if
    sync), close. Returns (file record or None, errno or None, where it
    failed). Without sync, what write() and close() accepted is what the
    file must hold after unmount. A write that fails must leave the file as
    it was: no partial data, no new size."""
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
                n = os.pwrite(fd, buf, off + i * CHUNK)
            else:
                n = os.pwrite(fd, data, off + i * CHUNK)
        except OSError as e:
            err, where = e.errno, f"write of chunk {i}"
            size = os.fstat(fd).st_size
            want = off + written * CHUNK if written else 0
            check(size == want, f"{name}: failed write of chunk {i} at {off + i * CHUNK} "
                  f"changed the size to {size}, want {want}")
            break
        if not check(n == CHUNK, f"{name}: write of chunk {i} returned {n} "
                     f"of {CHUNK} bytes: a short write"):
            err, where = "short", f"write of chunk {i}"
            break
        written += 1
    buf.close()
    synced = True
    try:
        if sync:
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
        return {"name": name, "seed": seed, "chunks": written, "off": off}, err, where
    os.unlink(path)                      # content not promised: drop it
    return None, err, where


def fill(tag, direct, at_least, sync=True, off=0):
    """Write files until a call fails. Returns the durable files, which must
    add up to at_least bytes: a tier that gives up early fails too."""
    files = []
    for k in range(LIMIT // FILE):
        rec, err, where = write_file(f"{tag}{k:03d}", direct, FILE // CHUNK, sync, off)
        if rec:
            files.append(rec)
        if err is not None:
            check(err == errno.ENOSPC,
                  f"{tag}{k:03d}: {where} failed with {err if err == 'short' else ename(err)}, "
                  f"want ENOSPC")
            print(f"  {tag}: {ename(err) if err != 'short' else err} at {where} of "
                  f"{tag}{k:03d}, {sum(f['chunks'] for f in files)} MiB durable",
                  file=sys.stderr)
            durable = sum(f["chunks"] for f in files) * CHUNK
            check(durable >= at_least, f"{tag}: ENOSPC after only {durable >> 20} MiB, "
                  f"want at least {at_least >> 20} MiB")
            return files
    check(False, f"{tag}: no error after writing {LIMIT >> 20} MiB to a 64 MiB tier")
    return files


def free_and_write(files, tag, direct, n):
    """Delete n files, then a new 4 MiB file must fit. Space may take a
    moment to come back: retry, bounded."""
    for f in files[:n]:
        os.unlink(os.path.join(MNT, f["name"]))
    del files[:n]
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
    check(False, f"{tag}: a 4 MiB file still does not fit after freeing {n * FILE >> 20} MiB "
          f"({last})")


if MODE == "fill":
    # Each 1 MiB write of the buffered fill straddles two blocks.
    files = fill("buf", direct=False, at_least=32 * MiB, off=MiB // 2)
    verify(files, "after buffered fill")
    free_and_write(files, "buf-again", direct=False, n=2)
    free_and_write(files, "dio-room", direct=True, n=8)     # 32 MiB for O_DIRECT
    files += fill("dio", direct=True, at_least=8 * MiB)
    verify(files, "after O_DIRECT fill")
    free_and_write(files, "dio-again", direct=True, n=2)
    verify(files, "after freeing space")
    # As the offloader writes: O_DIRECT, never fsync. ENOSPC must still come
    # from write() or close(), and what they accepted must survive unmount.
    free_and_write(files, "ns-room", direct=True, n=4)
    files += fill("nosync", direct=True, at_least=4 * MiB, sync=False, off=1024)
    verify(files, "after the fill without fsync")
    with open(STATE, "w") as f:
        json.dump(files, f)
elif MODE == "shared":
    # Two nvme folders on the one tmpfs: as the offloader writes, what
    # write() and close() accepted must fit the filesystem once, not once
    # per folder, and survive the unmount.
    files = fill("shared", direct=True, at_least=16 * MiB, sync=False, off=1024)
    verify(files, "after the fill of two folders on one filesystem")
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

# fill_then_verify MODE WHAT: mount, run MODE's fill, unmount, then mount
# again and check every file the fill kept. The remount check runs even
# when the fill failed, so that one run shows whether what was accepted
# survived.
fill_then_verify() {
	local rc1=0 rc2=0
	tfs_mount
	timeout -k 10 200 python3 "$T/enospc.py" "$1" "$MNT" "$T/files.json" || rc1=1
	tfs_umount || fail "tensorfs -f exited non-zero after unmount ($2)"
	if [ -s "$T/files.json" ]; then
		tfs_mount
		timeout -k 10 60 python3 "$T/enospc.py" verify "$MNT" "$T/files.json" || rc2=1
		tfs_umount || fail "tensorfs -f exited non-zero after unmount ($2)"
	fi
	[ "$rc1" -eq 0 ] || fail "ENOSPC checks failed ($2; see above)"
	[ "$rc2" -eq 0 ] || fail "surviving files are wrong after remount ($2; see above)"
}
fill_then_verify fill "one folder"

# Two nvme folders on the same 64 MiB filesystem (a second drive that did
# not mount): writers may reserve its space once. Counted once per
# folder, writes were accepted up to twice it (97 MiB), and the blocks
# over it waited in DRAM for a write-back that could never happen: the
# unmount failed and they were lost.
echo "two nvme folders on one filesystem"
rm -rf "${SMALL:?}"/* "$META" "$T/files.json"
mkdir -p "$SMALL/a" "$SMALL/b"
NVME="$SMALL/a:$SMALL/b"
fill_then_verify shared "two folders on one filesystem"
exit 0
