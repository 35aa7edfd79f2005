"""cache.py: what the cache matrices (cycle, scan, learner, dedup) share.

Each tensorfs target is one configuration of the cache (policy, prefetch,
dedup), mounted by cache_target; DirectFile reads and writes whole files
with O_DIRECT; run_cache checks memory and room, mounts each tensorfs
target once before any turn, then takes the turns.
"""

import os

from .runner import add_size_option, check_dram, check_room, die, fmt_size, log

CACHE_HELP = """\
cache matrices (not part of all; tensorfs dram=--cache-dram, 512M):
"""


def add_cache_dram(p):
    add_size_option(p, "--cache-dram", "512M",
                    "cycle, scan, dedup: tensorfs dram=")


class DirectFile:
    """O_DIRECT reads and writes of whole chunks (a MiB by default) with
    one aligned buffer, so that neither the page cache nor Python's copies
    are in the way."""

    def __init__(self, chunk=1 << 20):
        import mmap
        self.buf = mmap.mmap(-1, chunk)

    def read(self, path):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            off = 0
            while True:
                n = os.preadv(fd, [self.buf], off)
                if n == 0:
                    return off
                if n != len(self.buf):
                    raise OSError("short read of %s at %d: %d" % (path, off, n))
                off += n
        finally:
            os.close(fd)

    def write(self, path, size, stamp):
        """Write size bytes; each MiB starts with (stamp, offset) so that
        every pass writes new bytes (no dedup hit) at full size."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            for off in range(0, size, len(self.buf)):
                self.buf[0:16] = stamp.to_bytes(8, "little") + \
                    off.to_bytes(8, "little")
                n = os.pwritev(fd, [self.buf], off)
                if n != len(self.buf):
                    raise OSError("short write of %s at %d" % (path, off))
            os.fsync(fd)
        finally:
            os.close(fd)


def cache_delta(before, after):
    """(hits, misses) between two stats snapshots, or (None, None)."""
    try:
        return (after["cache"]["hits"] - before["cache"]["hits"],
                after["cache"]["misses"] - before["cache"]["misses"])
    except (TypeError, KeyError):
        return None, None


def opt(v, fmt="%.0f"):
    """A figure that only some targets have (raw has no cache): - if None."""
    return fmt % v if v is not None else "-"


def hit_pct(hits, misses):
    if hits is None or hits + misses == 0:
        return None
    return 100.0 * hits / (hits + misses)


def tfs_opts(bench, target):
    return {
        "tfs-auto": ["cache_policy=auto"],
        "tfs-base-auto": ["cache_policy=auto"],
        "tfs-lru": ["cache_policy=lru", "prefetch=off", "readahead=0"],
        "tfs-2q": ["cache_policy=2q", "prefetch=off", "readahead=0"],
        "tfs-clock": ["cache_policy=clock", "prefetch=off",
                      "readahead=0"],
        "tfs-learner": ["cache_policy=auto"],
        "tfs-nolearner": ["cache_policy=2q", "prefetch=off"],
        "tfs-dedup-off": ["dedup=off"],
        "tfs-dedup-trust": ["dedup=trust"],
        "tfs-dedup-verify": ["dedup=verify"],
    }[target]


def cache_target(bench, target, dram):
    if target == "raw":
        return bench.start_raw()
    extra = tfs_opts(bench, target)
    if bench.args.cycle_block:
        extra = extra + ["block=" + fmt_size(bench.args.cycle_block)]
    return bench.start_tfs(target, dram, extra=extra,
                          daemon=bench.args.tensorfs_base
                          if target.startswith("tfs-base") else None)


def run_cache(bench, args, matrix, have_tfs, all_targets, default_reps,
              dram, prepare, report):
    """One cache matrix: pick the targets, check memory, let
    prepare(bench, args) give (room needed on --dir, turn) or the lines of
    a "not run" report, mount each tensorfs target once, then the turns
    and report(...)."""
    targets = [t for t in all_targets if not t.startswith("tfs-base")]
    if args.targets:
        want = [t.strip() for t in args.targets.split(",") if t.strip()]
        targets = [t for t in all_targets if t in want or t == "raw"]
    if any(t.startswith("tfs-base") for t in targets) and not (
            args.tensorfs_base and os.access(args.tensorfs_base, os.X_OK)):
        die("target tfs-base-auto needs --tensorfs-base PATH, a tensorfs "
            "binary to run")
    reps = args.reps or default_reps
    if not have_tfs:
        return ["## %s" % matrix, "",
                "Not run: %s is not built." % args.tensorfs, ""]
    check_dram(dram)
    got = prepare(bench, args)
    if isinstance(got, list):
        return got
    need, turn = got
    check_room(args.dir, need, matrix)
    for t in targets:
        if t != "raw":
            bench.preflight(t, dram, t,
                            lambda t=t: cache_target(bench, t, dram))
    log("%s matrix: %s; %d repetition(s)" % (matrix, ", ".join(targets),
                                             reps))
    results = bench.run_matrix(targets, turn, reps)
    return report(results, args, reps, {})
