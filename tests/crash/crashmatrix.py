#!/usr/bin/env python3
"""The crash matrix: kill -9 the daemon at random points of a mixed
workload, many times over, and check after each crash that nothing that was
made durable is lost or wrong.

One iteration:
  1. the workload runs on the mount in a child process: new files written
     and fsynced (some O_DIRECT), scratch files never fsynced, overwrites of
     unaligned ranges, appends, replacements through a temporary file and
     rename, copies by copy_file_range, deletes. It logs each operation to a
     file outside the mount when it starts ("B ...") and when it has
     returned ("E"); data operations end with fsync before "E".
  2. after a random delay the daemon gets SIGKILL, and the mount is detached;
     the workload's next call fails and it exits (it must, within 20 s).
  3. tfsctl fsck checks the store as the crash left it (when tfsctl is
     built; TFSCTL names it).
  4. the daemon mounts the store again, and every file is checked against
     the model of what is durable:
       - a file whose last operation ended is exactly as that left it;
       - a completed rename shows the new file under the new name, and the
         temporary name is gone; a completed delete leaves no name;
       - the one operation in flight at the crash may show its old or its
         new state, byte by byte where it wrote (an append: new bytes or
         zeros), and nothing else;
       - scratch files may be there or not, and must read without error;
       - no other name exists.
  5. the model takes the state found for the operation in flight; scratch
     files are removed; the next iteration runs on this mount.

Every random choice comes from the seed (printed), so a failing seed
replays the same workload; the crash points differ with timing.

With an s3 tier (--nvme none --opts remote=s3://...), --objects GLOB names
the folders where the S3 server keeps the tier's packed objects (s3rver's
files): after each remount, once the tier has deleted what the crash left
(objects written but never committed, objects no block uses any more), the
objects there must be exactly those the tier says it stores: none leaked.

  crashmatrix.py --tensorfs BIN --work DIR [--iterations N] [--seed S]
                 [--nvme none --opts OPTS --objects GLOB]
"""
import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

from durable import (ALIGN, MiB, check_durable, check_readable, direct_ok, fsync_dir,
                     open_write, write_data)

MAX_FILES = 24        # durable files kept; deletes win above this
MAX_SIZE = 3 * MiB // 2


class Fail(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


class Daemon:
    """The tensorfs process: mount, kill -9, clean unmount."""

    def __init__(self, a):
        self.a = a
        self.proc = None
        self.mnt = os.path.join(a.work, "mnt")
        self.logf = open(os.path.join(a.work, "daemon.log"), "ab")
        os.makedirs(self.mnt, exist_ok=True)

    def mount(self):
        opts = (f"nvme={self.a.nvme},meta={self.a.meta},dram={self.a.dram},"
                f"threads={self.a.threads},sync_interval_ms=200")
        if self.a.opts:
            opts += "," + self.a.opts
        self.proc = subprocess.Popen([self.a.tensorfs, "-f", "-o", opts, self.mnt],
                                     stdout=self.logf, stderr=self.logf)
        with open(os.path.join(self.a.work, "daemon.pid"), "w") as f:
            f.write(f"{self.proc.pid}\n")
        for _ in range(600):
            if mounted(self.mnt):
                return
            if self.proc.poll() is not None:
                raise Fail(f"tensorfs exited {self.proc.returncode} before mounting")
            time.sleep(0.02)
        raise Fail("tensorfs did not mount within 12 s")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        subprocess.run(["fusermount3", "-u", "-z", self.mnt], stderr=subprocess.DEVNULL)

    def umount(self):
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt], check=True)
        rc = self.proc.wait(timeout=120) if self.proc else 0
        self.proc = None
        if rc != 0:
            raise Fail(f"tensorfs exited {rc} after a clean unmount")

    def stop(self):
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], stderr=subprocess.DEVNULL)
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


# ---- the workload (child process) ----

def gen(r, size):
    """Random bytes; now and then a zero block or a repeated one (dedup)."""
    if size and r.random() < 0.1:
        return bytes(size)
    if size >= 2 * MiB // 2 and r.random() < 0.2:
        half = r.randbytes(MiB // 2)
        return (half * (size // len(half) + 1))[:size]
    return r.randbytes(size)


def write_all(path, data, r, flags=os.O_CREAT | os.O_EXCL):
    """A new file holding data, sometimes written with O_DIRECT; its fd."""
    direct = direct_ok(data) and r.random() < 0.4
    fd = open_write(path, flags, direct)
    try:
        write_data(fd, data, r, direct)
        return fd
    except BaseException:
        os.close(fd)
        raise


def workload(root, logpath, sizes, seed):
    """Run operations until the daemon dies under us."""
    r = random.Random(seed)
    logf = open(logpath, "w", buffering=1)
    files = dict(sizes)
    n = 0

    def side(data):
        """Keep data outside the mount, for the checker; return its path."""
        nonlocal n
        n += 1
        path = f"{logpath}.{n}"
        with open(path, "wb") as f:
            f.write(data)
        return path

    def begin(*words):
        logf.write("B " + " ".join(str(w) for w in words) + "\n")

    def end():
        logf.write("E\n")

    def new_name(prefix):
        nonlocal n
        n += 1
        return f"{prefix}{seed % 100000:05d}_{n:04d}"

    while True:
        ops = ["new", "scratch", "overwrite", "append", "rename", "copy", "delete"]
        weights = [4, 1, 3, 2, 2, 2, 2 if len(files) < MAX_FILES else 12]
        op = r.choices(ops, weights)[0]
        if op in ("overwrite", "append", "rename", "copy", "delete") and not files:
            op = "new"
        if op in ("new", "scratch"):
            name = new_name("n" if op == "new" else "s")
            size = r.choice([0, 1, 4095, ALIGN, MiB, MiB + 1, r.randrange(MAX_SIZE)])
            data = gen(r, size)
            begin(op, name, side(data) if op == "new" else "-")
            fd = write_all(os.path.join(root, name), data, r)
            if op == "new":
                os.fsync(fd)
            os.close(fd)
            if op == "new":
                fsync_dir(root)
                files[name] = size
            end()
        elif op == "overwrite":
            name = r.choice(sorted(files))
            if files[name] < 2:
                continue
            off = r.randrange(files[name] - 1)
            ln = min(files[name] - off, r.choice([1, 1000, ALIGN, 70000, MiB, MAX_SIZE]))
            data = gen(r, ln)
            begin(op, name, off, ln, side(data))
            fd = os.open(os.path.join(root, name), os.O_WRONLY)
            try:
                if os.pwrite(fd, data, off) != ln:
                    raise OSError(0, "short overwrite")
                os.fsync(fd)
            finally:
                os.close(fd)
            end()
        elif op == "append":
            name = r.choice(sorted(files))
            ln = r.choice([1, 5000, MiB, r.randrange(1, MiB)])
            data = gen(r, ln)
            begin(op, name, files[name], ln, side(data))
            fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_APPEND)
            try:
                pos = 0
                while pos < ln:
                    pos += os.write(fd, data[pos:pos + MiB])
                os.fsync(fd)
            finally:
                os.close(fd)
            files[name] += ln
            end()
        elif op == "rename":
            # replace a file as checkpoints are: write a temporary, fsync, rename
            target = r.choice(sorted(files)) if r.random() < 0.7 else new_name("r")
            tmp = new_name("t")
            size = r.choice([1, ALIGN, MiB, r.randrange(MAX_SIZE)])
            data = gen(r, size)
            begin("tmpwrite", tmp, side(data))
            fd = write_all(os.path.join(root, tmp), data, r)
            os.fsync(fd)
            os.close(fd)
            fsync_dir(root)
            files[tmp] = size
            end()
            begin("rename", tmp, target)
            os.rename(os.path.join(root, tmp), os.path.join(root, target))
            files[target] = files.pop(tmp)
            end()
            fsync_dir(root)
        elif op == "copy":
            src = r.choice(sorted(files))
            dst = new_name("c")
            begin(op, src, dst)
            fi = os.open(os.path.join(root, src), os.O_RDONLY)
            fo = os.open(os.path.join(root, dst), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                left, off = files[src], 0
                while left:
                    got = os.copy_file_range(fi, fo, left, off, off)
                    if got <= 0:
                        raise OSError(0, f"copy_file_range returned {got}")
                    off += got
                    left -= got
                os.fsync(fo)
            finally:
                os.close(fi)
                os.close(fo)
            fsync_dir(root)
            files[dst] = files[src]
            end()
        elif op == "delete":
            name = r.choice(sorted(files))
            begin(op, name)
            os.unlink(os.path.join(root, name))
            del files[name]
            end()
            fsync_dir(root)


def run_workload(root, logpath, sizes, seed):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            workload(root, logpath, sizes, seed)
        except OSError:
            code = 3  # the daemon is gone: expected
        except BaseException as e:  # noqa: BLE001 - report anything else
            print(f"workload: {e!r}", file=sys.stderr)
            code = 4
        finally:
            os._exit(code)
    return pid


# ---- the model ----

def side_data(path):
    with open(path, "rb") as f:
        return f.read()


def parse_log(logpath):
    """Completed operations, and the one in flight (or None)."""
    with open(logpath) as f:
        lines = f.read().split("\n")
    done, cur = [], None
    # a last line without its newline was cut short: it was never written whole
    for line in lines[:-1]:
        w = line.split()
        if w[0] == "B":
            cur = w[1:]
        elif w[0] == "E":
            done.append(cur)
            cur = None
    return done, cur


def apply(files, op):
    """The durable state after a completed operation: name -> bytes."""
    kind = op[0]
    if kind in ("new", "tmpwrite"):
        files[op[1]] = side_data(op[2])
    elif kind == "overwrite":
        name, off, ln = op[1], int(op[2]), int(op[3])
        cur = bytearray(files[name])
        cur[off:off + ln] = side_data(op[4])
        files[name] = bytes(cur)
    elif kind == "append":
        files[op[1]] = files[op[1]] + side_data(op[4])
    elif kind == "rename":
        files[op[2]] = files.pop(op[1])
    elif kind == "copy":
        files[op[2]] = files[op[1]]
    elif kind == "delete":
        del files[op[1]]


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def byte_choices(got, old, new, what):
    """Each byte of got equals the byte of old or of new at its place."""
    if len(got) != len(new):
        raise Fail(f"{what}: {len(got)} bytes, expected {len(new)}")
    if got == old or got == new:
        return
    for i in range(0, len(got), ALIGN):
        g, o, n = got[i:i + ALIGN], old[i:i + ALIGN], new[i:i + ALIGN]
        if g == o or g == n:
            continue
        for j in range(len(g)):
            if g[j] != o[j] and g[j] != n[j]:
                raise Fail(f"{what}: byte {i + j} is {g[j]:#x}, neither old {o[j]:#x} "
                           f"nor new {n[j]:#x}")


def check(root, files, inflight):
    """
    Check the mount against the durable state (files), settling the
    operation in flight into it; return the names to remove afterwards.
    """
    present = set(os.listdir(root))
    maybe = set()  # may exist or not, with any content that reads
    kind = inflight[0] if inflight else None
    if kind in ("new", "scratch", "tmpwrite"):
        maybe.add(inflight[1])
    elif kind == "copy":
        maybe.add(inflight[2])
    elif kind == "overwrite":
        name, off, ln = inflight[1], int(inflight[2]), int(inflight[3])
        old = files[name]
        new = bytearray(old)
        new[off:off + ln] = side_data(inflight[4])
        got = read_file(os.path.join(root, name))
        if got[:off] != old[:off] or got[off + ln:] != old[off + ln:]:
            raise Fail(f"{name}: an overwrite in flight at {off}+{ln} changed bytes outside it")
        byte_choices(got, old, bytes(new), f"{name} (overwrite in flight)")
        files[name] = got
    elif kind == "append":
        name, base, ln = inflight[1], int(inflight[2]), int(inflight[3])
        data = side_data(inflight[4])
        got = read_file(os.path.join(root, name))
        if not base <= len(got) <= base + ln or got[:base] != files[name]:
            raise Fail(f"{name}: an append in flight left {len(got)} bytes (was {base}, "
                       f"appending {ln}) or changed what was there")
        tail = got[base:]
        byte_choices(tail, bytes(len(tail)), data[:len(tail)], f"{name} (append in flight)")
        files[name] = got
    elif kind == "rename":
        tmp, target = inflight[1], inflight[2]
        # before: both names as they were; after: the target holds the new file
        if tmp not in present:
            files[target] = files.pop(tmp)
    elif kind == "delete":
        if inflight[1] not in present:
            del files[inflight[1]]

    problems = check_durable(root, {name: [data] for name, data in files.items()})
    extra = present - set(files)
    unknown = {p for p in extra if not p.startswith("s") and p not in maybe}
    if unknown:
        problems.append(f"names that should not exist (deleted, renamed away or never "
                        f"completed): {sorted(unknown)[:5]}")
    problems += check_readable(root, extra)  # scratch and in-flight files must read
    if problems:
        raise Fail("; ".join(problems[:3]))
    return sorted(extra)


def stored_objects(mnt):
    with open(os.path.join(mnt, ".tensorfs", "stats")) as f:
        return json.load(f)["tiers"]["s3"]["objects"]


def check_objects(a, mnt, what):
    """No object in the bucket that the tier does not store: wait (15 s at
    most) for its deletes, then compare. Returns the count."""
    found = stored = None
    for _ in range(150):
        found = sum(len(glob.glob(os.path.join(d, "*._S3rver_object")))
                    for d in glob.glob(a.objects))
        stored = stored_objects(mnt)
        if found == stored:
            return found
        time.sleep(0.1)
    raise Fail(f"{what}: the bucket holds {found} objects of the tier, which stores {stored}: "
               f"{'leaked' if found > stored else 'lost'} objects")


def fsck(a, what):
    if not a.tfsctl or not os.access(a.tfsctl, os.X_OK):
        return "skipped (no tfsctl)"
    p = subprocess.run([a.tfsctl, "fsck", a.meta], capture_output=True, text=True)
    out = (p.stdout + p.stderr).strip()
    if p.returncode != 0:
        raise Fail(f"tfsctl fsck {what}: exit {p.returncode}:\n{out}")
    return out.splitlines()[-1] if out else "clean"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tensorfs", required=True)
    p.add_argument("--tfsctl", default="")
    p.add_argument("--work", required=True)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dram", default="64M")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--max-delay", type=float, default=1.2)
    p.add_argument("--nvme", default=None, help="the nvme= option (default WORK/nvme0)")
    p.add_argument("--opts", default="", help="more -o options (a remote tier)")
    p.add_argument("--objects", default="",
                   help="glob of the folders holding the s3 tier's objects (s3rver)")
    a = p.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    a.meta = os.path.join(a.work, "meta")
    if a.nvme is None:
        a.nvme = os.path.join(a.work, "nvme0")
        os.makedirs(a.nvme, exist_ok=True)
    log(f"crash matrix: {a.iterations} iterations, seed {seed}, fsck "
        f"{'by ' + a.tfsctl if a.tfsctl and os.access(a.tfsctl, os.X_OK) else 'not built'}")
    r = random.Random(seed)
    d = Daemon(a)
    files = {}  # the durable state: name -> bytes
    wlog = os.path.join(a.work, "ops.log")
    start = time.monotonic()
    stats = {"ops": 0, "inflight": {}}
    try:
        d.mount()
        root = os.path.join(d.mnt, "w")
        os.mkdir(root)
        fsync_dir(d.mnt)
        for it in range(1, a.iterations + 1):
            for f in os.listdir(a.work):
                if f.startswith("ops.log"):
                    os.unlink(os.path.join(a.work, f))
            wpid = run_workload(root, wlog, {k: len(v) for k, v in files.items()},
                                seed * 1000 + it)
            time.sleep(r.uniform(0.0, a.max_delay))
            d.kill9()
            for _ in range(200):
                done, status = os.waitpid(wpid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.1)
            else:
                os.kill(wpid, signal.SIGKILL)
                os.waitpid(wpid, 0)
                raise Fail(f"iteration {it}: the workload hangs after the daemon died")
            code = os.waitstatus_to_exitcode(status)
            if code not in (0, 3):
                raise Fail(f"iteration {it}: the workload failed (exit {code}) before the crash")
            completed, inflight = parse_log(wlog)
            for op in completed:
                apply(files, op)
            stats["ops"] += len(completed)
            k = inflight[0] if inflight else "none"
            stats["inflight"][k] = stats["inflight"].get(k, 0) + 1

            fsck_out = fsck(a, f"after the crash of iteration {it}")
            d.mount()
            for name in check(root, files, inflight):
                os.unlink(os.path.join(root, name))
            fsync_dir(root)
            objs = ""
            if a.objects:
                objs = f"; {check_objects(a, d.mnt, f'iteration {it}')} objects, none leaked"
            log(f"iteration {it}: {len(completed)} ops done, crash during "
                f"{' '.join(inflight[:2]) if inflight else 'nothing'}; "
                f"{len(files)} files intact; fsck: {fsck_out}{objs}")
        d.umount()
        fsck_out = fsck(a, "after the final clean unmount")
    except Fail as e:
        log(f"FAIL: {e} (seed {seed})")
        d.stop()
        return 1
    except BaseException:
        d.stop()
        raise
    d.stop()
    log(f"PASS: {a.iterations} crashes in {time.monotonic() - start:.0f} s, {stats['ops']} "
        f"operations completed; in flight at the crash: {json.dumps(stats['inflight'])}; "
        f"final fsck: {fsck_out} (seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
