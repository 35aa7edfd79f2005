#!/bin/bash
# Everything a file tree holds survives unmount and remount.
#
# The tree: files of awkward sizes (0, 1, 4095, 1 MiB, 1 MiB+1), a sparse
# file with data at 0 and at 100 MiB and a hole between, a file with a zero
# block between data, an all-zero 8 MiB file, nested and empty folders, a
# folder of 300 entries, symlinks (relative, absolute and dangling, long),
# hard links, xattrs (binary, empty, large), modes with setuid, setgid and
# sticky bits, owners, and atime/mtime set to the nanosecond.
#
# Contents are checked against sha256 sums computed from the generated
# bytes, not read back first. Each cycle: snapshot every lstat field, the
# symlink targets, xattrs and folder listings; unmount (the daemon must exit
# 0); remount; the new snapshot must equal the old one and every file its
# sum. Two cycles, the second with a different DRAM size.
#
# The all-zero file must take no space: nvme0 "used" grows by less than one
# block when it is written and fsynced, though it grows by the data's size
# when the other files are.

. "$(dirname "$0")/lib.sh"

SEED=${REMOUNT_SEED:-$((RANDOM << 15 | RANDOM))}
echo "remount test seed $SEED"
TREE="$T/tree.py"
# tree.py reads files as the crash tests do (tests/crash/durable.py).
export PYTHONPATH="$TFS_SRC/tests/crash${PYTHONPATH:+:$PYTHONPATH}"

cat >"$TREE" <<'PY'
"""Build, snapshot and check the tree for test_remount.sh."""
import errno
import hashlib
import json
import os
import random
import stat
import sys

from durable import chunks

MiB = 1 << 20
XATTR_SKIP = "user.tensorfs."  # the daemon's own, e.g. placement
problems = []


def problem(msg):
    problems.append(msg)
    print("MISMATCH: " + msg, file=sys.stderr)


def files(seed):
    """(path, [(offset, bytes)], size) for every regular file but zero8m."""
    r = random.Random(seed)
    out = [
        ("files/empty", [], 0),
        ("files/one", [(0, r.randbytes(1))], 1),
        ("files/b4095", [(0, r.randbytes(4095))], 4095),
        ("files/mib", [(0, r.randbytes(MiB))], MiB),
        ("files/mib1", [(0, r.randbytes(MiB + 1))], MiB + 1),
        ("files/sparse", [(0, r.randbytes(MiB)), (100 * MiB, r.randbytes(4196))],
         100 * MiB + 4196),
        ("files/zero-block-inside", [(0, r.randbytes(2 * MiB)),
                                     (2 * MiB, bytes(MiB)),
                                     (3 * MiB, r.randbytes(MiB - 7))], 4 * MiB - 7),
        ("files/mode4755", [(0, b"#!/bin/sh\nexit 0\n")], 17),
        ("a/b/c/d/e/deep.txt", [(0, b"deep\n")], 5),
        ("a/b/file", [(0, r.randbytes(12345))], 12345),
    ]
    for i in range(300):
        data = ("entry %d\n" % i).encode() * (i % 7)
        out.append(("many/f%03d" % i, [(0, data)] if data else [], len(data)))
    return out


ZERO = ("files/zero8m", 8 * MiB)


def sha_of(parts, size):
    h = hashlib.sha256()
    pos = 0
    for off, data in parts:
        while pos < off:
            n = min(off - pos, 4 * MiB)
            h.update(bytes(n))
            pos += n
        h.update(data)
        pos += len(data)
    while pos < size:
        n = min(size - pos, 4 * MiB)
        h.update(bytes(n))
        pos += n
    return h.hexdigest()


def write_file(root, path, parts, size):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for off, data in parts:
            if os.pwrite(fd, data, off) != len(data):
                raise OSError("short write to " + path)
        os.ftruncate(fd, size)  # no-op except where a hole ends the file
        os.fsync(fd)
    finally:
        os.close(fd)


def create_data(root, seed):
    for path, parts, size in files(seed):
        write_file(root, path, parts, size)
    os.makedirs(os.path.join(root, "emptydir"))
    os.makedirs(os.path.join(root, "links"))


def create_zero(root):
    path, size = ZERO
    full = os.path.join(root, path)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for off in range(0, size, MiB):
            if os.pwrite(fd, bytes(MiB), off) != MiB:
                raise OSError("short write to " + path)
        os.fsync(fd)
    finally:
        os.close(fd)


LONG_TARGET = "../" + "/".join(["long-component-%02d" % i for i in range(50)])
SYMLINKS = {
    "links/rel": "../files/one",
    "links/abs": "/nonexistent/absolute/target",
    "links/dir": "../a/b",
    "links/long": LONG_TARGET,
}
HARDLINKS = {"files/mib": ["links/mib.hard", "a/b/mib.hard2"]}
XATTRS = {
    "files/one": {"user.test": b"hello", "user.bin": bytes(range(256)), "user.empty": b""},
    "files/mib1": {"user.big": bytes(random.Random(7).randbytes(4000))},
    "a": {"user.dir": b"a folder"},
}
MODES = {
    "files/b4095": 0o600, "files/one": 0o444, "files/mode4755": 0o4755,
    "a/b/c": 0o700, "sgid": 0o2775, "sticky": 0o1777, "emptydir": 0o750,
}
OWNERS = {"files/mib1": (1234, 5678), "links/rel": (4321, 8765), "a/b": (1000, 1000),
          "files/zero8m": (0, 1234)}


def finish(root, seed, expect_path):
    for path, target in SYMLINKS.items():
        os.symlink(target, os.path.join(root, path))
    for path, names in HARDLINKS.items():
        for n in names:
            os.link(os.path.join(root, path), os.path.join(root, n))
    for path, xs in XATTRS.items():
        for k, v in xs.items():
            os.setxattr(os.path.join(root, path), k, v, follow_symlinks=False)
    os.makedirs(os.path.join(root, "sgid"))
    os.makedirs(os.path.join(root, "sticky"))
    for path, (uid, gid) in OWNERS.items():
        os.chown(os.path.join(root, path), uid, gid, follow_symlinks=False)
    for path, mode in MODES.items():  # after chown, which may clear setuid
        os.chmod(os.path.join(root, path), mode)
    # times last, children before parents, each entry its own values
    times = {}
    entries = []
    for d, dirs, fs in os.walk(root, topdown=False):
        for n in sorted(fs) + sorted(dirs):
            entries.append(os.path.relpath(os.path.join(d, n), root))
    by_ino = {}
    for i, path in enumerate(entries):
        if path.split("/")[0] == ".tensorfs":
            continue  # a listed control folder is reported by check_expect
        atime = 1_400_000_000_000_000_000 + i * 3_000_000_007
        mtime = 1_500_000_000_000_000_000 + i * 1_000_000_123
        ino = os.lstat(os.path.join(root, path)).st_ino
        if ino in by_ino:  # a hard link's inode keeps its first times
            times[path] = by_ino[ino]
            continue
        os.utime(os.path.join(root, path), ns=(atime, mtime), follow_symlinks=False)
        times[path] = by_ino[ino] = mtime
    expect = {"files": {}, "symlinks": SYMLINKS, "mtime": times,
              "modes": {p: m for p, m in MODES.items()},
              "owners": OWNERS, "hardlinks": HARDLINKS,
              "xattrs": {p: {k: v.hex() for k, v in xs.items()} for p, xs in XATTRS.items()}}
    for path, parts, size in files(seed):
        expect["files"][path] = {"size": size, "sha256": sha_of(parts, size)}
    expect["files"][ZERO[0]] = {"size": ZERO[1], "sha256": sha_of([], ZERO[1])}
    with open(expect_path, "w") as f:
        json.dump(expect, f)


def snapshot(root):
    """Every entry's metadata, without reading any file's data."""
    snap = {}

    def visit(path):
        full = os.path.join(root, path) if path else root
        st = os.lstat(full)
        e = {"type": stat.S_IFMT(st.st_mode), "mode": st.st_mode, "uid": st.st_uid,
             "gid": st.st_gid, "nlink": st.st_nlink, "mtime": st.st_mtime_ns,
             "ctime": st.st_ctime_ns, "ino": st.st_ino}
        if stat.S_ISREG(st.st_mode):
            e["size"] = st.st_size
            e["atime"] = st.st_atime_ns
        if stat.S_ISLNK(st.st_mode):
            e["size"] = st.st_size
            e["target"] = os.readlink(full)
        try:
            e["xattrs"] = {k: os.getxattr(full, k, follow_symlinks=False).hex()
                           for k in sorted(os.listxattr(full, follow_symlinks=False))
                           if not k.startswith(XATTR_SKIP)}
        except OSError as err:
            if not stat.S_ISLNK(st.st_mode) or err.errno not in (errno.ENOTSUP, errno.EPERM):
                raise
            e["xattrs"] = "not supported on symlinks"
        snap[path or "."] = e
        if stat.S_ISDIR(st.st_mode):
            names = sorted(os.listdir(full))
            e["entries"] = names
            for n in names:
                visit(os.path.join(path, n) if path else n)

    visit("")
    return snap


def link_groups(snap):
    groups = {}
    for path, e in snap.items():
        if e["type"] == stat.S_IFREG:
            groups.setdefault(e["ino"], []).append(path)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def compare_snapshots(old, new):
    for path in sorted(set(old) | set(new)):
        if path not in new:
            problem(f"{path}: gone after remount")
            continue
        if path not in old:
            problem(f"{path}: appeared after remount")
            continue
        for k in sorted(set(old[path]) | set(new[path])):
            if k == "ino":
                continue
            if old[path].get(k) != new[path].get(k):
                problem(f"{path}: {k} was {old[path].get(k)!r}, now {new[path].get(k)!r}")
    if link_groups(old) != link_groups(new):
        problem(f"hard link groups were {link_groups(old)}, now {link_groups(new)}")


def check_expect(root, snap, expect):
    def entry(path):
        if path not in snap:
            problem(f"{path}: missing")
        return snap.get(path)

    for path, want in expect["files"].items():
        if entry(path) is None:
            continue
        h = hashlib.sha256()
        n = 0
        try:
            with open(os.path.join(root, path), "rb") as f:
                for b in chunks(f):
                    h.update(b)
                    n += len(b)
        except OSError as err:
            problem(f"{path}: read failed after {n} bytes: {err}")
            continue
        if n != want["size"] or h.hexdigest() != want["sha256"]:
            problem(f"{path}: read {n} bytes sha256 {h.hexdigest()}, "
                    f"expected {want['size']} bytes sha256 {want['sha256']}")
        if snap[path]["size"] != want["size"]:
            problem(f"{path}: st_size {snap[path]['size']}, expected {want['size']}")
    for path, target in expect["symlinks"].items():
        e = entry(path)
        if e is not None and e.get("target") != target:
            problem(f"{path}: symlink target {e.get('target')!r}, expected {target!r}")
    for path, mtime in expect["mtime"].items():
        e = entry(path)
        if e is not None and e["mtime"] != mtime:
            problem(f"{path}: mtime {e['mtime']}, expected {mtime}")
    for path, mode in expect["modes"].items():
        e = entry(path)
        if e is not None and stat.S_IMODE(e["mode"]) != mode:
            problem(f"{path}: mode {oct(stat.S_IMODE(e['mode']))}, expected {oct(mode)}")
    for path, (uid, gid) in expect["owners"].items():
        e = entry(path)
        if e is not None and (e["uid"], e["gid"]) != (uid, gid):
            problem(f"{path}: owner {e['uid']}:{e['gid']}, expected {uid}:{gid}")
    for path, xs in expect["xattrs"].items():
        e = entry(path)
        if e is not None and e["xattrs"] != xs:
            problem(f"{path}: xattrs {e['xattrs']}, expected {xs}")
    want_groups = sorted(sorted([p] + names) for p, names in expect["hardlinks"].items())
    if link_groups(snap) != want_groups:
        problem(f"hard link groups {link_groups(snap)}, expected {want_groups}")
    for p, names in expect["hardlinks"].items():
        e = entry(p)
        if e is not None and e["nlink"] != 1 + len(names):
            problem(f"{p}: nlink {e['nlink']}, expected {1 + len(names)}")
    if ".tensorfs" in snap["."]["entries"]:
        problem(".tensorfs shows in the root folder's listing")
    if not os.path.exists(os.path.join(root, ".tensorfs", "stats")):
        problem(".tensorfs/stats cannot be reached by name")


def main():
    cmd, root = sys.argv[1], sys.argv[2]
    if cmd == "create-data":
        create_data(root, int(sys.argv[3]))
    elif cmd == "create-zero":
        create_zero(root)
    elif cmd == "finish":
        finish(root, int(sys.argv[3]), sys.argv[4])
    elif cmd == "check":
        # check ROOT EXPECT OLD-SNAPSHOT|- NEW-SNAPSHOT
        expect = json.load(open(sys.argv[3]))
        snap = snapshot(root)
        if sys.argv[4] != "-":
            compare_snapshots(json.load(open(sys.argv[4])), snap)
        check_expect(root, snap, expect)
        # what the next cycle must find: the state after these reads
        with open(sys.argv[5], "w") as f:
            json.dump(snapshot(root), f)
        if problems:
            print(f"{len(problems)} mismatches", file=sys.stderr)
            sys.exit(1)
        print(f"   {len(snap)} entries and {len(expect['files'])} file sums as expected")


main()
PY

nvme_used() {
	tfs_stat_json tiers nvme0 used || fail "cannot read nvme0 used from stats"
}

tfs_mount
BLOCK=$(tfs_stat_json block_size) || fail "no block_size in stats"
echo "== building the tree (block size $BLOCK)"
python3 "$TREE" create-data "$MNT" "$SEED" || fail "creating the tree failed"
USED_DATA=$(nvme_used)
python3 "$TREE" create-zero "$MNT" || fail "writing the all-zero file failed"
USED_ZERO=$(nvme_used)
echo "   nvme0 used: $USED_DATA after the data files, $USED_ZERO after the all-zero 8 MiB file"
# mib, mib1, sparse's first MiB and zero-block-inside's 3 MiB are random data
[ "$USED_DATA" -ge $((5 * 1048576)) ] ||
	fail "nvme0 used is $USED_DATA after fsyncing >= 5 MiB of random data: stats do not count"
[ $((USED_ZERO - USED_DATA)) -lt "$BLOCK" ] ||
	fail "the all-zero 8 MiB file took $((USED_ZERO - USED_DATA)) bytes of nvme0: not a hole"
python3 "$TREE" finish "$MNT" "$SEED" "$T/expect.json" || fail "setting attributes failed"
python3 "$TREE" check "$MNT" "$T/expect.json" - "$T/snap0.json" ||
	fail "the tree is not as written, before any remount"

echo "== cycle 1: unmount, remount with the same options"
tfs_umount || fail "tensorfs exited $? after unmount"
tfs_mount
python3 "$TREE" check "$MNT" "$T/expect.json" "$T/snap0.json" "$T/snap1.json" ||
	fail "the tree changed across unmount and remount (cycle 1)"
USED1=$(nvme_used)

echo "== cycle 2: unmount, remount with dram=64M"
tfs_umount || fail "tensorfs exited $? after unmount"
TFS_DRAM=64M tfs_mount
python3 "$TREE" check "$MNT" "$T/expect.json" "$T/snap1.json" "$T/snap2.json" ||
	fail "the tree changed across unmount and remount with dram=64M (cycle 2)"
USED2=$(nvme_used)
echo "   nvme0 used: $USED1 after cycle 1, $USED2 after cycle 2"
[ "$USED1" -eq "$USED2" ] || fail "nvme0 used went from $USED1 to $USED2 with no write in between"
[ $((USED2 - USED_DATA)) -lt "$BLOCK" ] ||
	fail "after remounts nvme0 used is $USED2, $((USED2 - USED_DATA)) over the data alone: the all-zero file takes space"
tfs_umount || fail "tensorfs exited $? after unmount"

echo "PASS: remount keeps data, holes and metadata"
exit 0
