"""What the crash tests share: writing files as applications do, and the
check after a crash that what was made durable is there.

crashmatrix.py (the crash matrix) and the writer of tests/mount/test_crash.sh
both write files in pieces of odd sizes, or with O_DIRECT from an aligned
buffer, fsync them and their folder; after the crash both check that every
durable file reads back as one of the versions it may hold, and that every
other file reads without error. A version is the bytes themselves, or
their (sha256, size) where the test keeps only a log.
"""
import hashlib
import mmap
import os

MiB = 1 << 20
ALIGN = 4096  # O_DIRECT's alignment of offsets, sizes and buffers


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def direct_ok(data):
    """O_DIRECT takes data only in whole aligned pieces."""
    return len(data) > 0 and len(data) % ALIGN == 0


def open_write(path, flags, direct):
    return os.open(path, os.O_WRONLY | flags | (os.O_DIRECT if direct else 0), 0o644)


def write_data(fd, data, r, direct, pieces=(4096, 65536, 300000, MiB)):
    """All of data at offset 0 of fd: with O_DIRECT a MiB at a time from an
    aligned buffer, else in pieces of sizes chosen by r. A short write fails."""
    if direct:
        buf = mmap.mmap(-1, MiB)
        try:
            for off in range(0, len(data), MiB):
                chunk = data[off:off + MiB]
                buf[:len(chunk)] = chunk
                n = os.pwritev(fd, [memoryview(buf)[:len(chunk)]], off)
                if n != len(chunk):
                    raise OSError(0, f"short O_DIRECT write: {n} of {len(chunk)}")
        finally:
            buf.close()
        return
    pos = 0
    while pos < len(data):
        n = os.pwrite(fd, data[pos:pos + r.choice(pieces)], pos)
        if n <= 0:
            raise OSError(0, f"write returned {n}")
        pos += n


def sha(data):
    return hashlib.sha256(data).hexdigest()


def chunks(f):
    """The rest of the open file f, 4 MiB at a time."""
    while True:
        b = f.read(4 * MiB)
        if not b:
            return
        yield b


def file_sum(path):
    """(sha256, size) of a file, read 4 MiB at a time."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for b in chunks(f):
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def _first_difference(got, want):
    return next((i for i in range(min(len(got), len(want))) if got[i] != want[i]),
                min(len(got), len(want)))


def check_durable(root, accept):
    """The problems of the durable files, one line each: every name of
    accept (relative to root) must exist and hold one of its versions."""
    problems = []
    for name, versions in sorted(accept.items()):
        path = os.path.join(root, name)
        try:
            if any(isinstance(v, bytes) for v in versions):
                with open(path, "rb") as f:
                    got = f.read()
                if got in versions:
                    continue
                want = next(v for v in versions if isinstance(v, bytes))
                problems.append(f"{name}: {len(got)} bytes {sha(got)[:12]}, expected "
                                f"{len(want)} bytes {sha(want)[:12]}; first difference "
                                f"at byte {_first_difference(got, want)}")
                continue
            got = file_sum(path)
        except OSError as err:
            problems.append(f"{name}: durable but missing or unreadable after the crash: "
                            f"{err}")
            continue
        if got not in versions:
            problems.append(f"{name}: sha256 {got[0]} size {got[1]}, expected one of "
                            f"{sorted(versions)}")
    return problems


def check_readable(root, names):
    """The problems of files that may hold anything but must read whole."""
    problems = []
    for name in sorted(names):
        try:
            file_sum(os.path.join(root, name))
        except OSError as err:
            problems.append(f"{name}: unreadable after the crash: {err}")
    return problems
