#!/bin/bash
# Mount test: the POSIX surface of a tensorfs mount.
#
# Phase 1 runs one section per operation family (getattr, setattr, mkdir,
# create, unlink, rename, symlink, link, readdir, readdirplus, statfs,
# fallocate, copy_file_range, xattrs, permissions, /.tensorfs, open-unlinked
# files) and records the whole tree: content hash, mode, owner, size, mtime,
# link groups, symlink targets and xattrs. Phase 2 runs after a clean
# unmount and a fresh mount, and checks that the tree is exactly the same,
# starting with `ls -l` on a cold cache so that readdirplus answers it.
#
# Content is read twice: through the page cache and with O_DIRECT, so that
# the daemon itself answers and the kernel's cache cannot hide a bad block.
# Every section runs even when an earlier one fails, and every failed check
# is printed, so one run shows all that is wrong.

. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null 2>&1 || skip "python3 not found"

export TFS_DRAM=256M
DRAM_BYTES=$((256 << 20))
# The permission checks run as nobody, who must be able to reach $MNT.
chmod 0755 "$T"

# check, ename, failures: tests/mount/checks.py
export PYTHONPATH="$TFS_SRC/tests/mount${PYTHONPATH:+:$PYTHONPATH}"
cat >"$T/posix.py" <<'PY'
import ctypes, errno, hashlib, json, mmap, os, random, stat, subprocess, sys
import time, traceback

from checks import check, ename, failures

PHASE, MNT, NVME, STATE, DRAM_BYTES = sys.argv[1:6]
DRAM_BYTES = int(DRAM_BYTES)
KiB, MiB = 1 << 10, 1 << 20
libc = ctypes.CDLL(None, use_errno=True)
os.umask(0)


def P(*parts):
    return os.path.join(MNT, *parts)


def copy_range(sfd, dfd, n, soff, doff, what):
    """copy_file_range n bytes from sfd at soff to dfd at doff (None, None:
    at the files' offsets), in as many calls as it takes; a call that copies
    nothing fails the check, named what."""
    done = 0
    while done < n:
        if soff is None:
            k = os.copy_file_range(sfd, dfd, n - done)
        else:
            k = os.copy_file_range(sfd, dfd, n - done, soff + done, doff + done)
        if not check(k > 0, f"{what} returned {k} at {done}"):
            break
        done += k


def expect_errno(fn, want, what):
    """fn() must raise OSError with an errno in want (an int or a tuple)."""
    want = want if isinstance(want, tuple) else (want,)
    names = "/".join(ename(w) for w in want)
    try:
        fn()
    except OSError as e:
        check(e.errno in want, f"{what}: got {ename(e.errno)}, want {names}")
        return
    check(False, f"{what}: succeeded, want {names}")


def rand(n, seed):
    return random.Random(seed).randbytes(n)


def write_all(fd, data, off=None):
    """Write data in full; a short count is a failure, not a retry."""
    n = os.write(fd, data) if off is None else os.pwrite(fd, data, off)
    check(n == len(data), f"write of {len(data)} bytes returned {n}")


def write_file(path, data, mode=0o644, fsync=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        if data:
            write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def read_direct(path):
    """Read a whole file with O_DIRECT into an aligned buffer."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, MiB)
    out = bytearray()
    try:
        while True:
            n = os.readv(fd, [buf])
            if n == 0:
                break
            out += buf[:n]
    finally:
        os.close(fd)
        buf.close()
    return bytes(out)


def first_diff(a, b):
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return min(len(a), len(b))


def same_content(path, want, what):
    """Both the cached and the O_DIRECT view of path must equal want."""
    ok = True
    for how, reader in (("read", read_file), ("O_DIRECT read", read_direct)):
        got = reader(path)
        if got != want:
            ok = False
            check(False, f"{what}: {how} gives {len(got)} bytes, want "
                  f"{len(want)}, first difference at {first_diff(got, want)}")
    return ok


def stats():
    with open(P(".tensorfs", "stats")) as f:
        return json.load(f)


def nvme_used():
    """nvme0's used bytes, or None (reported) when stats cannot say."""
    try:
        return int(stats()["tiers"]["nvme0"]["used"])
    except Exception as e:
        check(False, f"reading tiers.nvme0.used from stats: {type(e).__name__}: {e}")
        return None


sections = []


def section(fn):
    sections.append(fn)
    return fn


# ---------------------------------------------------------------- phase 1

@section
def copy_file_range():
    # First, while the tree is empty: the nvme "used" counter must move for
    # this file alone.
    n = 8 * MiB
    data = rand(n, 1)
    u0 = nvme_used()
    write_file(P("cfr_src"), data, fsync=True)
    u1 = nvme_used()
    if u0 is not None and u1 is not None:
        check(u1 - u0 >= n * 3 // 4,
              f"writing and fsyncing {n} bytes grew nvme0 used by {u1 - u0}")

    sfd = os.open(P("cfr_src"), os.O_RDWR)
    dfd = os.open(P("cfr_dst"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    copy_range(sfd, dfd, n, None, None, "copy_file_range")
    os.fsync(dfd)
    os.fsync(sfd)
    same_content(P("cfr_dst"), data, "copy_file_range copy")
    u2 = nvme_used()
    if u1 is not None and u2 is not None:
        check(u2 - u1 < n // 2,
              f"copy of {n} bytes grew nvme0 used by {u2 - u1}: blocks not shared")

    # Copy-on-write, both ways.
    patch = b"Z" * 4096
    os.pwrite(dfd, patch, 3 * MiB + 1000)
    os.fsync(dfd)
    same_content(P("cfr_src"), data, "original after writing to the copy")
    dst = bytearray(data)
    dst[3 * MiB + 1000:3 * MiB + 1000 + len(patch)] = patch
    os.pwrite(sfd, b"Y" * 10, 5 * MiB)
    os.fsync(sfd)
    same_content(P("cfr_dst"), bytes(dst), "copy after writing to the original")
    src = bytearray(data)
    src[5 * MiB:5 * MiB + 10] = b"Y" * 10
    same_content(P("cfr_src"), bytes(src), "original after its own write")
    os.close(sfd)
    os.close(dfd)

    # Unaligned offsets, into an existing file, across block boundaries.
    a = rand(300000, 2)
    pre = rand(3 * MiB, 3)
    write_file(P("cfr_a"), a)
    write_file(P("cfr_b"), pre)
    afd = os.open(P("cfr_a"), os.O_RDONLY)
    bfd = os.open(P("cfr_b"), os.O_WRONLY)
    copy_range(afd, bfd, 200000, 12345, MiB - 100, "unaligned copy_file_range")
    os.close(afd)
    os.close(bfd)
    want = bytearray(pre)
    want[MiB - 100:MiB - 100 + 200000] = a[12345:12345 + 200000]
    same_content(P("cfr_b"), bytes(want), "unaligned copy_file_range")

    # A source that is still dirty in the cache, with a hole in it.
    data = rand(MiB, 15) + bytes(2 * MiB) + rand(MiB + 5, 16)
    sfd = os.open(P("cfr_dirty"), os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    write_all(sfd, data[:MiB], 0)
    write_all(sfd, data[3 * MiB:], 3 * MiB)
    dfd = os.open(P("cfr_dirty_copy"), os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    copy_range(sfd, dfd, len(data), 0, 0, "copy_file_range of a dirty file")
    os.close(sfd)
    os.close(dfd)
    same_content(P("cfr_dirty_copy"), data, "copy of a dirty file with a hole")


@section
def getattr_lookup():
    write_file(P("ga"), b"x" * 1234, mode=0o640)
    st = os.stat(P("ga"))
    check(stat.S_ISREG(st.st_mode), f"ga mode {oct(st.st_mode)} not regular")
    check(stat.S_IMODE(st.st_mode) == 0o640,
          f"ga created 0640, stat says {oct(stat.S_IMODE(st.st_mode))}")
    check(st.st_size == 1234, f"ga size {st.st_size}, want 1234")
    check(st.st_nlink == 1, f"ga nlink {st.st_nlink}, want 1")
    check(st.st_uid == os.geteuid() and st.st_gid == os.getegid(),
          f"ga owner {st.st_uid}:{st.st_gid}, want the creator's")
    write_file(P("ga2"), b"")
    check(os.stat(P("ga2")).st_ino != st.st_ino, "two files share an inode")
    check(stat.S_ISDIR(os.stat(MNT).st_mode), "mount root is not a directory")
    expect_errno(lambda: os.stat(P("nope")), errno.ENOENT, "stat missing")
    expect_errno(lambda: os.stat(P("ga", "sub")), errno.ENOTDIR,
                 "stat below a file")
    long_name = "n" * 255
    write_file(P(long_name), b"255")
    check(read_file(P(long_name)) == b"255", "255-byte name does not read back")
    os.unlink(P(long_name))


@section
def setattr():
    p = P("sa")
    write_file(p, b"abc")
    for mode in (0o640, 0o000, 0o755):
        os.chmod(p, mode)
        got = stat.S_IMODE(os.stat(p).st_mode)
        check(got == mode, f"chmod {oct(mode)} gives {oct(got)}")
    os.chown(p, 1234, 5678)
    st = os.stat(p)
    check((st.st_uid, st.st_gid) == (1234, 5678),
          f"chown 1234:5678 gives {st.st_uid}:{st.st_gid}")
    os.chown(p, -1, 42)
    st = os.stat(p)
    check((st.st_uid, st.st_gid) == (1234, 42),
          f"chown -1:42 gives {st.st_uid}:{st.st_gid}")

    # Times to the nanosecond, on a file that is never read again (phase 2
    # compares atime too).
    t = P("times")
    write_file(t, b"")
    at, mt = 1234567890123456789, 1600000000987654321
    os.utime(t, ns=(at, mt))
    st = os.stat(t)
    check((st.st_atime_ns, st.st_mtime_ns) == (at, mt),
          f"utimens ns gives atime {st.st_atime_ns} mtime {st.st_mtime_ns}")
    UTIME_OMIT = (1 << 30) - 2

    class timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
    ts = (timespec * 2)(timespec(0, UTIME_OMIT), timespec(1500000000, 111))
    r = libc.utimensat(-100, t.encode(), ts, 0)
    check(r == 0, f"utimensat UTIME_OMIT: {ename(ctypes.get_errno())}")
    st = os.stat(t)
    check(st.st_atime_ns == at, f"UTIME_OMIT changed atime to {st.st_atime_ns}")
    check(st.st_mtime_ns == 1500000000000000111,
          f"mtime {st.st_mtime_ns}, want 1500000000000000111")

    # UTIME_NOW (a clock value, checked loosely) and mtime moved by a write.
    u = P("times_now")
    write_file(u, b"1")
    os.utime(u, ns=(10**18, 10**18))
    before = time.time_ns()
    os.utime(u)
    st = os.stat(u)
    check(abs(st.st_mtime_ns - before) < 60 * 10**9,
          f"utime(now) gives mtime {st.st_mtime_ns}, clock is {before}")
    os.utime(u, ns=(10**18, 10**18))
    fd = os.open(u, os.O_WRONLY)
    write_all(fd, b"more", 1)
    os.close(fd)
    check(os.stat(u).st_mtime_ns != 10**18, "write did not update mtime")

    # truncate down and up: what was cut off must not come back.
    data = rand(2 * MiB + MiB // 2, 4)
    write_file(p, data)
    os.truncate(p, MiB + MiB // 2)
    check(os.stat(p).st_size == MiB + MiB // 2, "truncate down: wrong size")
    same_content(p, data[:MiB + MiB // 2], "truncate down")
    os.truncate(p, 3 * MiB)
    check(os.stat(p).st_size == 3 * MiB, "truncate up: wrong size")
    same_content(p, data[:MiB + MiB // 2] + bytes(3 * MiB - (MiB + MiB // 2)),
                 "truncate up after down")
    os.truncate(p, 100)
    os.truncate(p, 4096)
    same_content(p, data[:100] + bytes(3996), "truncate 100 then 4096")
    fd = os.open(p, os.O_RDWR)
    os.ftruncate(fd, 5000)
    check(os.fstat(fd).st_size == 5000, "ftruncate up: wrong size")
    check(os.pread(fd, 5000, 0) == data[:100] + bytes(4900), "ftruncate up: content")
    os.ftruncate(fd, 10)
    check(os.fstat(fd).st_size == 10, "ftruncate down: wrong size")
    write_all(fd, b"end", 2 * MiB)
    os.fsync(fd)
    os.close(fd)
    same_content(p, data[:10] + bytes(2 * MiB - 10) + b"end",
                 "write past EOF after ftruncate")
    os.truncate(p, 0)
    check(os.stat(p).st_size == 0 and read_file(p) == b"", "truncate to 0")


@section
def dirs():
    d = P("d1")
    os.mkdir(d, 0o750)
    st = os.stat(d)
    check(stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o750,
          f"mkdir 0750 gives {oct(st.st_mode)}")
    expect_errno(lambda: os.mkdir(d), errno.EEXIST, "mkdir existing")
    expect_errno(lambda: os.mkdir(P("nodir", "x")), errno.ENOENT,
                 "mkdir below a missing folder")
    os.mkdir(P("d1", "sub"))
    write_file(P("d1", "f"), b"1")
    expect_errno(lambda: os.rmdir(d), (errno.ENOTEMPTY, errno.EEXIST),
                 "rmdir non-empty")
    expect_errno(lambda: os.rmdir(P("nodir")), errno.ENOENT, "rmdir missing")
    expect_errno(lambda: os.rmdir(P("d1", "f")), errno.ENOTDIR, "rmdir a file")
    expect_errno(lambda: os.unlink(P("d1", "sub")), (errno.EISDIR, errno.EPERM),
                 "unlink a folder")
    check(sorted(os.listdir(d)) == ["f", "sub"],
          f"d1 holds {sorted(os.listdir(d))}")
    os.rmdir(P("d1", "sub"))
    os.unlink(P("d1", "f"))
    os.rmdir(d)
    expect_errno(lambda: os.stat(d), errno.ENOENT, "stat removed folder")
    check("d1" not in os.listdir(MNT), "removed folder still listed")

    deep = P(*["deep"] + [f"l{i}" for i in range(20)])
    os.makedirs(deep)
    write_file(os.path.join(deep, "leaf"), b"leaf")
    check(read_file(os.path.join(deep, "leaf")) == b"leaf", "deep leaf content")


@section
def create_open():
    p = P("co")
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    check(stat.S_IMODE(os.fstat(fd).st_mode) == 0o600, "create 0600: mode")
    expect_errno(lambda: os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY),
                 errno.EEXIST, "O_CREAT|O_EXCL on existing file")
    expect_errno(lambda: os.open(P("co_missing"), os.O_RDONLY), errno.ENOENT,
                 "open missing without O_CREAT")
    a, b, c = rand(5000, 5), rand(7000, 6), rand(333, 7)
    write_all(fd, a, 0)
    write_all(fd, b, MiB - 3)               # straddles a block boundary
    write_all(fd, c, 5 * MiB + 7)           # leaves a gap
    size = 5 * MiB + 7 + len(c)
    check(os.fstat(fd).st_size == size, f"size {os.fstat(fd).st_size}, want {size}")
    want = bytearray(size)
    want[0:5000] = a
    want[MiB - 3:MiB - 3 + 7000] = b
    want[5 * MiB + 7:] = c
    check(os.pread(fd, 100, size) == b"", "read at EOF is not empty")
    check(os.pread(fd, 100, size + MiB) == b"", "read past EOF is not empty")
    os.close(fd)
    same_content(p, bytes(want), "pwrite at scattered offsets")

    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    write_all(fd, b"tail")
    os.close(fd)
    st = os.stat(p)
    check(st.st_size == size + 4, f"O_APPEND: size {st.st_size}, want {size + 4}")
    check(read_file(p)[-4:] == b"tail", "O_APPEND: tail")
    os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
    check(os.stat(p).st_size == 0, "O_TRUNC did not empty the file")

    # Many small unaligned writes: every one is a read-modify-write.
    q = P("small_writes")
    data = rand(MiB + 1000, 8)
    fd = os.open(q, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    for off in range(0, len(data), 4097):
        write_all(fd, data[off:off + 4097])
    os.fsync(fd)
    os.close(fd)
    same_content(q, data, "4097-byte sequential writes")

    # One write() spanning four blocks, starting and ending mid-block.
    q = P("multi_block")
    data = rand(2 * MiB + MiB // 2, 14)
    fd = os.open(q, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    write_all(fd, data, MiB // 2 - 3)
    os.close(fd)
    same_content(q, bytes(MiB // 2 - 3) + data, "one write across four blocks")

    # O_DIRECT writes of 1 MiB at offsets only 1 KiB aligned, as the
    # offloader issues them.
    q = P("direct_1k")
    fd = os.open(q, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o644)
    buf = mmap.mmap(-1, MiB)
    want = bytearray()
    for i, off in enumerate((1024, MiB + 3072, 3 * MiB + 1024)):
        chunk = rand(MiB, 20 + i)
        buf[:] = chunk
        n = os.pwrite(fd, buf, off)
        check(n == MiB, f"O_DIRECT pwrite at {off} returned {n}")
        if len(want) < off + MiB:
            want.extend(bytes(off + MiB - len(want)))
        want[off:off + MiB] = chunk
    buf.close()
    os.close(fd)
    same_content(q, bytes(want), "O_DIRECT 1 MiB writes at 1 KiB offsets")

    # A reader's O_DIRECT descriptor, opened before a writer's grows the
    # file, reads all of it after each write: the writer's goes straight to
    # the daemon (direct_io), the read-only one through the page cache's
    # code, which stops at the size the kernel holds. Phase 2 reads it again.
    q = P("direct_grow")
    w = os.open(q, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o644)
    r = os.open(q, os.O_RDONLY | os.O_DIRECT)
    wbuf, rbuf = mmap.mmap(-1, 2 * MiB), mmap.mmap(-1, 2 * MiB)
    want = bytearray()
    for i in range(3):
        wbuf[:] = rand(2 * MiB, 30 + i)
        n = os.pwrite(w, wbuf, len(want))
        check(n == 2 * MiB, f"O_DIRECT pwrite growing direct_grow returned {n}")
        want += wbuf[:]
        got = bytearray()
        while True:
            n = os.preadv(r, [rbuf], len(got))
            if n == 0:
                break
            got += rbuf[:n]
        check(got == want, f"read-only O_DIRECT fd after write {i}: {len(got)} bytes, "
              f"want {len(want)}, first difference at {first_diff(got, want)}")
    for fd in (w, r):
        os.close(fd)
    wbuf.close()
    rbuf.close()
    same_content(q, bytes(want), "O_DIRECT writes read through a descriptor opened before")

    # A sparse file of 1 TiB: block indexes far from zero.
    q = P("sparse_tib")
    fd = os.open(q, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    os.ftruncate(fd, 1 << 40)
    check(os.pread(fd, 4096, (1 << 40) - 8192) == bytes(4096), "read in a 1 TiB hole")
    write_all(fd, b"end!", (1 << 40) - 4)
    write_all(fd, b"mid", 1 << 39)
    os.fsync(fd)
    check(os.fstat(fd).st_size == 1 << 40, f"1 TiB file size {os.fstat(fd).st_size}")
    check(os.pread(fd, 8, (1 << 40) - 8) == bytes(4) + b"end!", "tail of a 1 TiB file")
    check(os.pread(fd, 5, (1 << 39) - 1) == b"\0mid\0", "middle of a 1 TiB file")
    os.close(fd)
    os.unlink(q)


@section
def unlink():
    p = P("ul")
    write_file(p, b"A" * MiB, fsync=True)
    os.unlink(p)
    expect_errno(lambda: os.stat(p), errno.ENOENT, "stat unlinked")
    check("ul" not in os.listdir(MNT), "unlinked file still listed")
    expect_errno(lambda: os.unlink(p), errno.ENOENT, "unlink twice")
    # Same name again: none of the old blocks may show through.
    fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o644)
    check(os.fstat(fd).st_size == 0, "recreated file is not empty")
    os.ftruncate(fd, MiB)
    os.close(fd)
    same_content(p, bytes(MiB), "recreated file extended by truncate")


def renameat2(old, new, flags):
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        r = fn(-100, old.encode(), -100, new.encode(), ctypes.c_uint(flags))
    else:
        nr = {"x86_64": 316, "aarch64": 276}[os.uname().machine]
        r = libc.syscall(nr, -100, old.encode(), -100, new.encode(),
                         ctypes.c_uint(flags))
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), old)


@section
def rename():
    r = lambda *x: P("r", *x)
    os.mkdir(P("r"))
    write_file(r("a"), b"AAA")
    ino = os.stat(r("a")).st_ino
    os.rename(r("a"), r("b"))
    expect_errno(lambda: os.stat(r("a")), errno.ENOENT, "old name after rename")
    check(read_file(r("b")) == b"AAA", "renamed file content")
    check(os.stat(r("b")).st_ino == ino, "rename changed the inode number")

    write_file(r("c"), b"CCCCCC")
    os.rename(r("b"), r("c"))
    check(read_file(r("c")) == b"AAA", "rename over a file: content")
    check(sorted(os.listdir(P("r"))) == ["c"],
          f"after rename over a file, r holds {sorted(os.listdir(P('r')))}")

    os.mkdir(r("x"))
    os.rename(r("c"), r("x", "c"))
    check(read_file(r("x", "c")) == b"AAA", "rename across folders")

    os.mkdir(r("d1"))
    write_file(r("d1", "f"), b"in d1")
    os.mkdir(r("d2"))
    os.rename(r("d1"), r("d2"))
    expect_errno(lambda: os.stat(r("d1")), errno.ENOENT, "folder after rename")
    check(read_file(r("d2", "f")) == b"in d1", "folder over empty folder: child")

    os.mkdir(r("d3"))
    write_file(r("d3", "g"), b"in d3")
    expect_errno(lambda: os.rename(r("d3"), r("d2")),
                 (errno.ENOTEMPTY, errno.EEXIST), "folder over non-empty folder")
    check(read_file(r("d3", "g")) == b"in d3" and read_file(r("d2", "f")) == b"in d1",
          "failed rename changed a folder")
    expect_errno(lambda: os.rename(r("x", "c"), r("d3")), errno.EISDIR,
                 "file over folder")
    expect_errno(lambda: os.rename(r("d3"), r("x", "c")), errno.ENOTDIR,
                 "folder over file")

    RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
    write_file(r("n1"), b"n1")
    write_file(r("n2"), b"n2")
    expect_errno(lambda: renameat2(r("n1"), r("n2"), RENAME_NOREPLACE),
                 errno.EEXIST, "RENAME_NOREPLACE over existing")
    check(read_file(r("n1")) == b"n1" and read_file(r("n2")) == b"n2",
          "failed RENAME_NOREPLACE changed a file")
    renameat2(r("n1"), r("n3"), RENAME_NOREPLACE)
    check(read_file(r("n3")) == b"n1" and not os.path.exists(r("n1")),
          "RENAME_NOREPLACE to a free name")

    write_file(r("x1"), b"one")
    write_file(r("x2"), b"two")
    try:
        renameat2(r("x1"), r("x2"), RENAME_EXCHANGE)
        check(read_file(r("x1")) == b"two" and read_file(r("x2")) == b"one",
              "RENAME_EXCHANGE succeeded but did not swap")
        renameat2(r("x1"), r("d3"), RENAME_EXCHANGE)
        check(os.path.isdir(r("x1")) and read_file(r("d3")) == b"two" and
              read_file(r("x1", "g")) == b"in d3",
              "RENAME_EXCHANGE of a file and a folder did not swap")
        renameat2(r("x1"), r("d3"), RENAME_EXCHANGE)
    except OSError as e:
        check(e.errno == errno.EINVAL,
              f"RENAME_EXCHANGE: {ename(e.errno)}, want success or EINVAL")
        check(read_file(r("x1")) == b"one" and read_file(r("x2")) == b"two",
              "refused RENAME_EXCHANGE changed a file")

    # Renaming over a file that is open: the open file keeps its content.
    write_file(r("t1"), b"old")
    fd = os.open(r("t1"), os.O_RDONLY)
    write_file(r("t2"), b"new!")
    os.rename(r("t2"), r("t1"))
    check(os.pread(fd, 100, 0) == b"old", "open file replaced by rename: content")
    os.close(fd)
    check(read_file(r("t1")) == b"new!", "rename over open file: new content")


@section
def symlinks():
    os.symlink("target/of/link", P("sl"))
    check(os.readlink(P("sl")) == "target/of/link", "readlink")
    st = os.lstat(P("sl"))
    check(stat.S_ISLNK(st.st_mode), "lstat of a symlink is not a link")
    check(st.st_size == len("target/of/link"), f"symlink size {st.st_size}")
    expect_errno(lambda: os.stat(P("sl")), errno.ENOENT, "stat dangling symlink")
    write_file(P("slt"), b"hello")
    os.symlink("slt", P("sl2"))
    check(read_file(P("sl2")) == b"hello", "read through symlink")
    check(os.stat(P("sl2")).st_ino == os.stat(P("slt")).st_ino,
          "stat through symlink gives another inode")
    long_target = "/".join(["abcdefghi"] * 400)[:4000]
    os.symlink(long_target, P("sl_long"))
    check(os.readlink(P("sl_long")) == long_target, "4000-byte symlink target")
    expect_errno(lambda: os.symlink("x", P("slt")), errno.EEXIST,
                 "symlink over existing name")
    expect_errno(lambda: os.readlink(P("slt")), errno.EINVAL, "readlink of a file")
    os.unlink(P("sl2"))
    check(read_file(P("slt")) == b"hello", "unlinking a symlink hurt its target")


@section
def links():
    a, b, c = P("ln_a"), P("ln_b"), P("ln_c")
    write_file(a, b"data1")
    os.link(a, b)
    sa, sb = os.stat(a), os.stat(b)
    check(sa.st_ino == sb.st_ino, "link has another inode")
    check(sa.st_nlink == 2 and sb.st_nlink == 2,
          f"nlink after link: {sa.st_nlink}/{sb.st_nlink}, want 2")
    fd = os.open(b, os.O_WRONLY | os.O_APPEND)
    write_all(fd, b"+more")
    os.close(fd)
    check(read_file(a) == b"data1+more", "write through a link not seen")
    os.link(a, c)
    check(os.stat(b).st_nlink == 3, "nlink after second link")
    os.unlink(a)
    check(os.stat(b).st_nlink == 2, "nlink after unlink of one name")
    check(read_file(b) == b"data1+more", "data lost after unlink of one name")
    os.unlink(c)
    check(os.stat(b).st_nlink == 1, "nlink back to 1")
    expect_errno(lambda: os.link(b, P("slt")), errno.EEXIST, "link over existing")
    os.mkdir(P("lnd"))
    expect_errno(lambda: os.link(P("lnd"), P("lnd2")), errno.EPERM,
                 "link of a folder")
    os.link(b, P("lnd", "b2"))
    check(os.stat(b).st_nlink == 2, "link into another folder: nlink")


@section
def readdir_big():
    d = P("big")
    os.mkdir(d)
    names = [f"entry-{i:04d}-" + "x" * (i % 60) for i in range(2000)]
    for n in names:
        os.close(os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY, 0o644))
    got = os.listdir(d)
    check(len(got) == len(set(got)), f"readdir: {len(got) - len(set(got))} duplicates")
    check(set(got) == set(names), f"readdir: {len(set(names) - set(got))} missing, "
          f"{len(set(got) - set(names))} unexpected")
    check(all(e.is_file(follow_symlinks=False) for e in os.scandir(d)),
          "readdir: d_type of a regular file is not DT_REG")

    # Delete while reading, as rm -rf does, and also delete names that were
    # not reached yet. Names never deleted before they were reached must each
    # show up exactly once.
    seen, seen_set, early = [], set(), set()
    pending = list(reversed(names))
    with os.scandir(d) as it:
        for k, e in enumerate(it):
            if e.name in early:
                continue        # deleted before it was reached: may show
            seen.append(e.name)
            seen_set.add(e.name)
            os.unlink(e.path)
            if k % 10 == 0:
                while pending and (pending[-1] in early or pending[-1] in seen_set):
                    pending.pop()
                if pending:
                    v = pending.pop()
                    os.unlink(os.path.join(d, v))
                    early.add(v)
    dup = len(seen) - len(set(seen))
    check(dup == 0, f"readdir while deleting: {dup} names returned twice")
    missed = set(names) - early - set(seen)
    check(not missed, f"readdir while deleting skipped {len(missed)} names, "
          f"e.g. {sorted(missed)[:3]}")
    left = os.listdir(d)
    check(left == [], f"{len(left)} names left after deleting all")
    if not left:
        os.rmdir(d)

    # rm -rf of a tree.
    t = P("rmrf")
    for i in range(10):
        os.makedirs(os.path.join(t, f"s{i}"))
        for j in range(100):
            write_file(os.path.join(t, f"s{i}", f"f{j}"), b"x" * j)
    r = subprocess.run(["rm", "-rf", t], capture_output=True, text=True)
    check(r.returncode == 0 and not os.path.exists(t),
          f"rm -rf: rc {r.returncode}, {r.stderr.strip()[:200]}")


LS_FILES = {"s0": (0, 0o600), "s1": (1, 0o644), "s4097": (4097, 0o755),
            "s3m": (3 * MiB, 0o640)}


def check_ls(what):
    """ls -l (readdirplus) must show the sizes and modes that were set."""
    env = dict(os.environ, LC_ALL="C")
    r = subprocess.run(["ls", "-lan", P("lsd")], capture_output=True, text=True,
                       env=env)
    if not check(r.returncode == 0, f"{what}: ls -lan rc {r.returncode}: {r.stderr}"):
        return
    rows = {}
    for line in r.stdout.splitlines()[1:]:
        f = line.split(None, 8)
        if len(f) == 9:
            rows[f[8].split(" -> ")[0]] = f
    check("." in rows and ".." in rows, f"{what}: ls -la lacks . or ..")
    for name, (size, mode) in LS_FILES.items():
        f = rows.get(name)
        if not check(f is not None, f"{what}: ls -l lacks {name}"):
            continue
        want = stat.filemode(stat.S_IFREG | mode)
        check(f[0].rstrip(".+") == want and int(f[4]) == size,
              f"{what}: ls -l {name}: {f[0]} size {f[4]}, want {want} size {size}")
    f = rows.get("sub")
    check(f is not None and f[0].startswith("d"), f"{what}: ls -l sub not a folder")
    f = rows.get("lnk")
    check(f is not None and f[0].startswith("l"), f"{what}: ls -l lnk not a link")


@section
def readdirplus():
    os.mkdir(P("lsd"))
    for name, (size, mode) in LS_FILES.items():
        write_file(P("lsd", name), rand(size, size), mode=mode)
        os.chmod(P("lsd", name), mode)
    os.mkdir(P("lsd", "sub"))
    os.symlink("s1", P("lsd", "lnk"))
    check_ls("phase 1")


@section
def statfs():
    sv = os.statvfs(MNT)
    check(sv.f_bsize > 0 and sv.f_frsize > 0, f"statvfs block size {sv.f_bsize}/{sv.f_frsize}")
    check(sv.f_blocks > 0, "statvfs: zero total blocks")
    check(sv.f_bfree <= sv.f_blocks, f"statvfs: free {sv.f_bfree} > total {sv.f_blocks}")
    check(sv.f_bavail <= sv.f_bfree, f"statvfs: avail {sv.f_bavail} > free {sv.f_bfree}")
    check(sv.f_namemax >= 255, f"statvfs: namemax {sv.f_namemax}")
    r = subprocess.run(["df", "-B1", MNT], capture_output=True, text=True)
    check(r.returncode == 0, f"df: rc {r.returncode} {r.stderr.strip()}")


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def fallocate(fd, mode, off, length):
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                               ctypes.c_int64]
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@section
def fallocate_mode0():
    fd = os.open(P("fa"), os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    fallocate(fd, 0, 0, 3 * MiB + 5)
    check(os.fstat(fd).st_size == 3 * MiB + 5, f"fallocate: size {os.fstat(fd).st_size}")
    same_content(P("fa"), bytes(3 * MiB + 5), "fallocated range")
    head = rand(100, 9)
    write_all(fd, head, 0)
    fallocate(fd, 0, 0, 4 * MiB)
    check(os.fstat(fd).st_size == 4 * MiB, "fallocate over data: size")
    os.close(fd)
    same_content(P("fa"), head + bytes(4 * MiB - 100), "fallocate over data")


@section
def punch_hole():
    # A hole from the middle of block 0 to the middle of block 2.
    data = rand(4 * MiB, 10)
    fd = os.open(P("ph"), os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    write_all(fd, data)
    os.fsync(fd)
    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, MiB // 2, 2 * MiB)
    check(os.fstat(fd).st_size == 4 * MiB, f"punch changed size to {os.fstat(fd).st_size}")
    os.fsync(fd)
    os.close(fd)
    same_content(P("ph"), data[:MiB // 2] + bytes(2 * MiB) + data[MiB // 2 + 2 * MiB:],
                 "punched file")

    # The same on data still dirty in the cache.
    data = rand(3 * MiB, 17)
    fd = os.open(P("ph_dirty"), os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    write_all(fd, data)
    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, MiB - 10, MiB + 20)
    os.close(fd)
    same_content(P("ph_dirty"), data[:MiB - 10] + bytes(MiB + 20) + data[2 * MiB + 10:],
                 "hole punched in dirty data")


@section
def xattrs():
    p = P("xa")
    write_file(p, b"x")
    os.setxattr(p, "user.a", b"v1")
    check(os.getxattr(p, "user.a") == b"v1", "getxattr after setxattr")
    check("user.a" in os.listxattr(p), f"listxattr: {os.listxattr(p)}")
    expect_errno(lambda: os.setxattr(p, "user.a", b"v9", os.XATTR_CREATE),
                 errno.EEXIST, "XATTR_CREATE on existing")
    expect_errno(lambda: os.setxattr(p, "user.missing", b"v", os.XATTR_REPLACE),
                 errno.ENODATA, "XATTR_REPLACE on missing")
    check(os.getxattr(p, "user.a") == b"v1", "failed XATTR_CREATE changed the value")
    os.setxattr(p, "user.a", b"v2", os.XATTR_REPLACE)
    check(os.getxattr(p, "user.a") == b"v2", "XATTR_REPLACE")
    libc.getxattr.restype = ctypes.c_ssize_t
    libc.listxattr.restype = ctypes.c_ssize_t
    n = libc.getxattr(p.encode(), b"user.a", None, ctypes.c_size_t(0))
    check(n == 2, f"getxattr size query gives {n}, want 2")
    buf = ctypes.create_string_buffer(1)
    n = libc.getxattr(p.encode(), b"user.a", buf, ctypes.c_size_t(1))
    check(n == -1 and ctypes.get_errno() == errno.ERANGE,
          f"getxattr into a short buffer: {n} {ename(ctypes.get_errno())}, want ERANGE")
    n = libc.listxattr(p.encode(), None, ctypes.c_size_t(0))
    check(n >= len(b"user.a\0"), f"listxattr size query gives {n}")
    os.setxattr(p, "user.empty", b"")
    check(os.getxattr(p, "user.empty") == b"", "empty xattr value")
    big = rand(4000, 11) + b"\0\0"
    os.setxattr(p, "user.big", big)
    check(os.getxattr(p, "user.big") == big, "4002-byte binary xattr value")
    for i in range(10):
        os.setxattr(p, f"user.k{i}", str(i).encode())
    names = set(os.listxattr(p))
    check({f"user.k{i}" for i in range(10)} <= names, f"listxattr: {sorted(names)}")
    os.removexattr(p, "user.k3")
    expect_errno(lambda: os.getxattr(p, "user.k3"), errno.ENODATA,
                 "getxattr after removexattr")
    expect_errno(lambda: os.removexattr(p, "user.k3"), errno.ENODATA,
                 "removexattr twice")
    check("user.k3" not in os.listxattr(p), "removed xattr still listed")
    expect_errno(lambda: os.getxattr(p, "user.never"), errno.ENODATA,
                 "getxattr never set")
    os.mkdir(P("xd"))
    os.setxattr(P("xd"), "user.d", b"on a folder")
    check(os.getxattr(P("xd"), "user.d") == b"on a folder", "xattr on a folder")
    os.link(p, P("xa_link"))
    check(os.getxattr(P("xa_link"), "user.a") == b"v2", "xattr through a hard link")


NOBODY = r'''
import errno, os, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "read":
        open(path, "rb").read()
    elif op == "create":
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    elif op == "chmod":
        os.chmod(path, 0o777)
    elif op == "unlink":
        os.unlink(path)
    print("OK")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
'''


@section
def permissions():
    if os.geteuid() != 0:
        print("  skipped: permission checks need root to switch users")
        return
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    py = None
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        try:
            r = subprocess.run(prefix + [cand, "-c", "print('OK')"], env=env,
                               cwd="/", capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if r.stdout.strip() == "OK":
            py = cand
            break
    if not check(py is not None, "no python3 that nobody can run"):
        return

    def as_nobody(op, path):
        r = subprocess.run(prefix + [py, "-c", NOBODY, op, path], env=env,
                           cwd="/", capture_output=True, text=True, timeout=60)
        return r.stdout.strip() or r.stderr.strip()[-200:]

    os.chmod(MNT, 0o755)
    d = P("perm")
    os.mkdir(d, 0o755)
    write_file(os.path.join(d, "secret"), b"secret", mode=0o600)
    write_file(os.path.join(d, "public"), b"public", mode=0o644)
    os.mkdir(os.path.join(d, "open"), 0o777)
    cases = [("read", "public", "OK"), ("read", "secret", "EACCES"),
             ("create", "new", "EACCES"), ("create", "open/mine", "OK"),
             ("chmod", "secret", "EPERM"), ("unlink", "public", "EACCES")]
    for op, name, want in cases:
        got = as_nobody(op, os.path.join(d, name))
        check(got == want, f"as nobody, {op} {name}: {got}, want {want}")
    mine = os.path.join(d, "open", "mine")
    if os.path.exists(mine):
        st = os.stat(mine)
        check((st.st_uid, st.st_gid) == (65534, 65534),
              f"file created by nobody is owned by {st.st_uid}:{st.st_gid}")
    check(read_file(os.path.join(d, "public")) == b"public", "public file changed")


@section
def hidden_control():
    check(".tensorfs" not in os.listdir(MNT), "/.tensorfs shows in readdir")
    check(stat.S_ISDIR(os.stat(P(".tensorfs")).st_mode), "/.tensorfs is not a folder")
    check(stat.S_ISREG(os.stat(P(".tensorfs", "stats")).st_mode),
          "/.tensorfs/stats is not a file")
    expect_errno(lambda: os.mkdir(P(".tensorfs")),
                 (errno.EEXIST, errno.EPERM, errno.EACCES), "mkdir /.tensorfs")
    s = stats()
    check(s.get("block_size") == MiB, f"stats block_size {s.get('block_size')}")
    counters = ("capacity", "used", "read_bytes", "write_bytes", "read_ops",
                "write_ops", "errors")
    tiers = s.get("tiers", {})
    for tier in ("dram", "nvme0"):
        t = tiers.get(tier)
        if not check(isinstance(t, dict), f"stats: no tier {tier}"):
            continue
        for k in counters:
            check(isinstance(t.get(k), int) and t[k] >= 0,
                  f"stats tiers.{tier}.{k} = {t.get(k)!r}")
        if isinstance(t.get("used"), int) and isinstance(t.get("capacity"), int):
            check(t["used"] <= t["capacity"], f"{tier}: used > capacity")
    if isinstance(tiers.get("dram"), dict):
        check(tiers["dram"].get("capacity") == DRAM_BYTES,
              f"dram capacity {tiers['dram'].get('capacity')}, want {DRAM_BYTES}")
    nv = tiers.get("nvme0", {})
    check(isinstance(nv.get("path"), str) and
          os.path.realpath(nv.get("path", "")) == os.path.realpath(NVME),
          f"nvme0 path {nv.get('path')!r}, want {NVME}")
    check(nv.get("engine") in ("io_uring", "libaio"), f"nvme0 engine {nv.get('engine')!r}")
    c = s.get("cache", {})
    for k in ("hits", "misses", "dirty_bytes", "evictions"):
        check(isinstance(c.get(k), int) and c[k] >= 0, f"stats cache.{k} = {c.get(k)!r}")
    if all(isinstance(c.get(k), int) for k in ("hits", "misses")):
        check(c["hits"] + c["misses"] > 0, "cache saw no reads after O_DIRECT reads")


@section
def open_unlinked():
    p = P("ou")
    data = rand(MiB + MiB // 2, 12)
    fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    fd2 = os.open(p, os.O_RDONLY)
    write_all(fd, data)
    os.unlink(p)
    expect_errno(lambda: os.stat(p), errno.ENOENT, "stat of unlinked open file")
    check("ou" not in os.listdir(MNT), "unlinked open file still listed")
    os.close(fd2)
    check(os.pread(fd, len(data) + 10, 0) == data, "read of unlinked open file")
    more = rand(MiB, 13)
    write_all(fd, more, len(data))
    check(os.fstat(fd).st_size == len(data) + len(more), "fstat of unlinked open file")
    check(os.pread(fd, 3 * MiB, 0) == data + more, "read back write to unlinked file")
    os.fsync(fd)
    os.ftruncate(fd, 100)
    check(os.fstat(fd).st_size == 100, "ftruncate of unlinked open file")
    write_file(p, b"new file")
    check(os.pread(fd, 200, 0) == data[:100], "new file with the same name leaked in")
    os.close(fd)
    check(read_file(p) == b"new file", "new file with the same name")


# ------------------------------------------------------ record and compare

def snapshot():
    """Everything phase 2 must find again, keyed by path."""
    tree, inodes = {}, {}
    for root, dirs, files in os.walk(MNT):
        if root == MNT and ".tensorfs" in dirs:
            dirs.remove(".tensorfs")    # reported by hidden_control
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, MNT)
            st = os.lstat(path)
            e = {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid,
                 "size": st.st_size, "nlink": st.st_nlink,
                 "mtime_ns": st.st_mtime_ns}
            if rel == "times":
                e["atime_ns"] = st.st_atime_ns
            if stat.S_ISDIR(st.st_mode):
                e.pop("size")
                e.pop("nlink")
                e.pop("mtime_ns")
            if stat.S_ISLNK(st.st_mode):
                e["target"] = os.readlink(path)
            else:
                e["xattrs"] = {n: os.getxattr(path, n).hex()
                               for n in sorted(os.listxattr(path))
                               if not n.startswith("user.tensorfs.")}
            if stat.S_ISREG(st.st_mode):
                if rel != "times":      # never read, so its atime holds
                    e["sha256"] = hashlib.sha256(read_direct(path)).hexdigest()
                inodes.setdefault(st.st_ino, []).append(rel)
            tree[rel] = e
    links = sorted(sorted(v) for v in inodes.values() if len(v) > 1)
    return {"tree": tree, "links": links}


def compare(want, got):
    wt, gt = want["tree"], got["tree"]
    for rel in sorted(set(wt) - set(gt)):
        check(False, f"after remount: {rel} is missing")
    for rel in sorted(set(gt) - set(wt)):
        check(False, f"after remount: {rel} appeared")
    for rel in sorted(set(wt) & set(gt)):
        for k in sorted(set(wt[rel]) | set(gt[rel])):
            check(wt[rel].get(k) == gt[rel].get(k),
                  f"after remount: {rel} {k} is {gt[rel].get(k)!r}, "
                  f"was {wt[rel].get(k)!r}")
    check(want["links"] == got["links"],
          f"after remount: hard link groups {got['links']}, were {want['links']}")


def run(fns):
    for fn in fns:
        print(f"# {fn.__name__}", file=sys.stderr)
        try:
            fn()
        except Exception as e:
            check(False, f"{fn.__name__}: {type(e).__name__}: {e}")
            traceback.print_exc()


if PHASE == "phase1":
    run(sections)
    try:
        with open(STATE, "w") as f:
            json.dump(snapshot(), f)
    except Exception as e:
        check(False, f"recording the tree: {type(e).__name__}: {e}")
else:
    def ls_after_remount():
        check_ls("phase 2, cold cache")
    run([ls_after_remount])
    try:
        with open(STATE) as f:
            compare(json.load(f), snapshot())
    except Exception as e:
        check(False, f"comparing the tree: {type(e).__name__}: {e}")
        traceback.print_exc()

if failures:
    print(f"{len(failures)} checks failed in {PHASE}", file=sys.stderr)
    sys.exit(1)
PY

# Phase 2 runs even when phase 1 failed, so that one run shows everything.
tfs_mount allow_other
rc1=0
timeout -k 10 200 python3 "$T/posix.py" phase1 "$MNT" "$NVME" "$T/tree.json" "$DRAM_BYTES" || rc1=1
tfs_umount || fail "tensorfs -f exited non-zero after a clean unmount"

rc2=0
if [ -s "$T/tree.json" ]; then
	tfs_mount allow_other
	timeout -k 10 200 python3 "$T/posix.py" phase2 "$MNT" "$NVME" "$T/tree.json" "$DRAM_BYTES" || rc2=1
	tfs_umount || fail "tensorfs -f exited non-zero after a clean unmount"
fi
[ "$rc1" -eq 0 ] || fail "POSIX checks failed (see above)"
[ "$rc2" -eq 0 ] || fail "the tree differs after unmount and mount (see above)"
exit 0
