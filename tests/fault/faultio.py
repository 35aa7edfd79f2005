#!/usr/bin/env python3
"""Writer and checker for the fault injection tests.

Every file's bytes follow from its name and a seed, so that a reader can
tell right data from wrong without keeping a copy. The writer records what
each call returned (a JSON line per file); the checker reads the files back
in chunks and sorts every chunk into one of three bins:

  ok      the exact bytes that were written
  error   an errno the test allows (EIO by default): the fault reached the
          application as an error, which is what it must do
  wrong   anything else: other bytes, a short read, an errno not allowed

and fails if the "wrong" bin is not empty. Counts go to stdout as one JSON
object, so the shell test can also require that errors did happen.

  faultio.py write DIR LOG COUNT SEED [--min B] [--max B] [--allow E,E]
  faultio.py read DIR LOG [--passes N] [--allow E,E] [--direct] [--threads N]
  faultio.py patch DIR LOG SEED [--allow E,E]
"""
import argparse
import errno
import json
import mmap
import os
import random
import sys
import threading

MiB = 1 << 20
ALIGN = 4096


def content(name, seed, size):
    return random.Random(f"{seed}/{name}").randbytes(size)


def ename(e):
    return errno.errorcode.get(e, str(e))


def allowed_set(s):
    return {getattr(errno, n) for n in s.split(",") if n}


def load(log):
    files = {}
    with open(log) as f:
        for line in f:
            rec = json.loads(line)
            files[rec["name"]] = rec  # a later line (patch) replaces the first
    return files


def expected(rec):
    """What the file holds: all of it, or what the writer's calls accepted."""
    data = bytearray(content(rec["key"], rec["seed"], rec["size"]))
    if rec.get("written", rec["size"]) < rec["size"]:
        # a write failed; what was accepted before it must be there
        del data[rec["written"]:]
    for p in rec.get("patches", []):
        data[p["off"]:p["off"] + p["len"]] = content(f'{rec["key"]}@{p["off"]}', p["seed"], p["len"])
    return bytes(data)


def call(outcome, what, allowed, fn, *args):
    """Run fn; record "ok" or the errno name; an errno not allowed raises."""
    try:
        r = fn(*args)
        outcome.setdefault(what, "ok")
        return r
    except OSError as e:
        if e.errno not in allowed:
            raise
        outcome[what] = ename(e.errno)
        return None


def write_file(path, data, r, allowed):
    out = {}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        pos = 0
        while pos < len(data):
            n = min(len(data) - pos, r.choice([4096, 65536, 300000, MiB, 2 * MiB]))
            got = call(out, "write", allowed, os.pwrite, fd, data[pos:pos + n], pos)
            if got is None:
                break
            # A short count is legal when the kernel split the request and a
            # later part failed: the next call must then report the error.
            if got == 0:
                raise OSError(0, f"write to {path} returned 0 at {pos}")
            pos += got
        call(out, "fsync", allowed, os.fsync, fd)
    finally:
        call(out, "close", allowed, os.close, fd)
    out.setdefault("write", "ok")  # nothing to write
    out["written"] = pos
    return out


def cmd_write(a):
    r = random.Random(a.seed)
    allowed = allowed_set(a.allow)
    os.makedirs(a.dir, exist_ok=True)
    counts = {}
    with open(a.log, "a") as log:
        for i in range(a.count):
            name = f"f{i:04d}"
            # the folder is part of the key: files of other tests must not dedup
            key = f"{os.path.basename(os.path.normpath(a.dir))}/{name}"
            size = r.randint(a.min, a.max)
            out = write_file(os.path.join(a.dir, name), content(key, a.seed, size), r, allowed)
            rec = {"name": name, "key": key, "seed": a.seed, "size": size, **out}
            log.write(json.dumps(rec) + "\n")
            for k in ("write", "fsync", "close"):
                v = out.get(k, "skipped")
                counts[f"{k}_{v}"] = counts.get(f"{k}_{v}", 0) + 1
    print(json.dumps(counts))


def read_chunks(path, want, r, direct, allowed, bins, exact=True):
    """Read path in chunks of random size; sort each chunk into bins."""
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        key = "error" if e.errno in allowed else "wrong"
        bins[key] += 1
        if key == "wrong":
            print(f"WRONG: open {path}: {e}", file=sys.stderr)
        return
    buf = mmap.mmap(-1, 4 * MiB) if direct else None
    try:
        pos = 0
        while pos < len(want):
            n = r.choice([ALIGN, 65536, MiB, 3 * MiB]) if direct else r.choice(
                [1, 4095, 65536, 1000000, MiB, 3 * MiB])
            n = min(n, len(want) - pos)
            try:
                if direct:
                    got = os.preadv(fd, [memoryview(buf)[:(n + ALIGN - 1) // ALIGN * ALIGN]], pos)
                    data = buf[:min(got, n)]
                else:
                    data = os.pread(fd, n, pos)
            except OSError as e:
                if e.errno in allowed:
                    bins["error"] += 1
                    bins.setdefault(ename(e.errno), 0)
                    bins[ename(e.errno)] += 1
                else:
                    bins["wrong"] += 1
                    print(f"WRONG: {path} at {pos}+{n}: {e}", file=sys.stderr)
                pos += n
                continue
            if data == want[pos:pos + n]:
                bins["ok"] += 1
            elif 0 < len(data) < n and data == want[pos:pos + len(data)]:
                # A short count is legal: the kernel split the request and a
                # later part failed. The rest is read (or fails) next.
                bins["ok"] += 1
                bins["short"] = bins.get("short", 0) + 1
                pos += len(data)
                continue
            else:
                bins["wrong"] += 1
                diff = next((i for i in range(min(len(data), n)) if data[i] != want[pos + i]), None)
                print(f"WRONG: {path} at {pos}+{n}: got {len(data)} bytes, first difference "
                      f"at {diff}", file=sys.stderr)
            pos += n
        # and nothing past the end (unless a failed write may have left some)
        try:
            tail = os.pread(fd, 1, len(want)) if exact and not direct else b""
            if tail:
                bins["wrong"] += 1
                print(f"WRONG: {path}: bytes past its size {len(want)}", file=sys.stderr)
        except OSError as e:
            bins["error" if e.errno in allowed else "wrong"] += 1
    finally:
        os.close(fd)
        if buf:
            buf.close()


def cmd_read(a):
    files = load(a.log)
    allowed = allowed_set(a.allow)
    bins = {"ok": 0, "error": 0, "wrong": 0}
    lock = threading.Lock()
    names = sorted(files)

    def worker(t):
        r = random.Random(a.seed * 1000 + t)
        mine = {"ok": 0, "error": 0, "wrong": 0}
        for _ in range(a.passes):
            for name in names:
                rec = files[name]
                if a.only_synced and rec.get("fsync") != "ok":
                    continue
                read_chunks(os.path.join(a.dir, name), expected(rec), r,
                            a.direct, allowed, mine, rec.get("write") == "ok")
        with lock:
            for k, v in mine.items():
                bins[k] = bins.get(k, 0) + v

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(bins))
    sys.exit(1 if bins["wrong"] else 0)


def cmd_patch(a):
    """Overwrite unaligned ranges of each file in place, then fsync it."""
    files = load(a.log)
    allowed = allowed_set(a.allow)
    r = random.Random(a.seed)
    counts = {}
    with open(a.log, "a") as log:
        for name in sorted(files):
            rec = files[name]
            if rec["size"] < 2:
                continue
            off = r.randrange(rec["size"] - 1)
            n = min(r.randint(1, 300000), rec["size"] - off)
            data = content(f'{rec["key"]}@{off}', a.seed, n)
            out = {}
            fd = os.open(os.path.join(a.dir, name), os.O_WRONLY)
            try:
                got = call(out, "write", allowed, os.pwrite, fd, data, off)
                if got is not None and got != n:
                    raise OSError(0, f"short write to {name}: {got} of {n}")
                call(out, "fsync", allowed, os.fsync, fd)
            finally:
                call(out, "close", allowed, os.close, fd)
            if out.get("write") == "ok":
                rec = dict(rec)
                rec["patches"] = rec.get("patches", []) + [{"off": off, "len": n, "seed": a.seed}]
                log.write(json.dumps(rec) + "\n")
            for k, v in out.items():
                counts[f"{k}_{v}"] = counts.get(f"{k}_{v}", 0) + 1
    print(json.dumps(counts))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("log")
    w.add_argument("count", type=int)
    w.add_argument("seed", type=int)
    w.add_argument("--min", type=int, default=1)
    w.add_argument("--max", type=int, default=3 * MiB)
    w.add_argument("--allow", default="EIO")
    rd = sub.add_parser("read")
    rd.add_argument("dir")
    rd.add_argument("log")
    rd.add_argument("--passes", type=int, default=1)
    rd.add_argument("--allow", default="")
    rd.add_argument("--direct", action="store_true")
    rd.add_argument("--threads", type=int, default=1)
    rd.add_argument("--seed", type=int, default=1)
    rd.add_argument("--only-synced", action="store_true")
    pa = sub.add_parser("patch")
    pa.add_argument("dir")
    pa.add_argument("log")
    pa.add_argument("seed", type=int)
    pa.add_argument("--allow", default="EIO")
    a = p.parse_args()
    {"write": cmd_write, "read": cmd_read, "patch": cmd_patch}[a.cmd](a)


if __name__ == "__main__":
    main()
