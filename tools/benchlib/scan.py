"""scan.py: the scan matrix, a hot file read between one-time scans.

Why 2q is the policy without a cycle: a hot file of a quarter of the DRAM
tier keeps its hits under scans as large as the tier, where clock and lru
lose them.
"""

import os
import time

from .cache import (CACHE_HELP, DirectFile, add_cache_dram, cache_delta,
                    cache_target, hit_pct, opt, run_cache)
from .runner import cell, drop_caches, fmt_size, log, med, plural, ratio

MATRIX = "scan"
SUMMARY = "a hot file between one-time scans: 2q, clock, lru"

HELP = CACHE_HELP + """\
  scan         a hot file of dram/4 read between one-time scans as large
               as dram: 2q against clock and lru (why 2q is the default
               without a cycle). Targets: raw, tfs-2q, tfs-clock, tfs-lru.
"""

TOOLS = []

TARGETS = ["raw", "tfs-2q", "tfs-clock", "tfs-lru"]
DEFAULT_REPS = 3

SCAN_ROUNDS = 5
SCAN_TIMED_FROM = 3      # rounds before this one warm the policy up


def add_options(p):
    add_cache_dram(p)


def scan_turn(bench, target):
    a = bench.args
    io = DirectFile()
    hot_size = a.cache_dram // 4 >> 20 << 20
    nscan = 4    # scan files per round: together as large as the DRAM
    directory, handle = cache_target(bench, target, a.cache_dram)
    res = {}
    if directory is None:
        return res
    try:
        hot = os.path.join(directory, "hot")
        io.write(hot, hot_size, 0)
        scans = [os.path.join(directory, "s%02d" % i)
                 for i in range(SCAN_ROUNDS * nscan)]
        for i, f in enumerate(scans):
            io.write(f, hot_size, i + 1)
        if target != "raw" and bench.remount(handle) is None:
            return res
        drop_caches()
        hot_hits = hot_miss = 0
        hot_s = 0.0
        t0 = None
        moved = 0
        for r in range(1, SCAN_ROUNDS + 1):
            if r == SCAN_TIMED_FROM:
                t0 = time.monotonic()
                moved = 0
            before = bench.tfs_stats(directory)
            th = time.monotonic()
            moved += io.read(hot)
            dt = time.monotonic() - th
            h, m = cache_delta(before, bench.tfs_stats(directory))
            if r >= SCAN_TIMED_FROM:
                hot_s += dt
                if h is not None:
                    hot_hits += h
                    hot_miss += m
            for f in scans[(r - 1) * nscan:r * nscan]:
                moved += io.read(f)
        secs = time.monotonic() - t0
    finally:
        took = bench.stop_target(handle)
    if took is None:
        return res
    timed = SCAN_ROUNDS - SCAN_TIMED_FROM + 1
    res = {"mbs": moved / secs / 1e6,
           "hot_mbs": hot_size * timed / hot_s / 1e6,
           "hot_hit": hit_pct(hot_hits, hot_miss) if target != "raw"
           else None}
    log("  %-15s all %8.0f MB/s  hot file %8.0f MB/s  hot hit %s%%" % (
        target, res["mbs"], res["hot_mbs"], opt(res["hot_hit"], "%.1f")))
    return res


def scan_report(results, args, reps, skipped):
    hot = fmt_size(args.cache_dram // 4 >> 20 << 20)
    out = ["## scan: a hot file read between one-time scans, dram=%s"
           % fmt_size(args.cache_dram), ""]
    out.append("Each of %d rounds reads a hot file of %s (a quarter of the "
               "DRAM tier), then 4 files of %s read once and never again "
               "(a scan as large as the DRAM tier). Rounds %d to %d are "
               "timed. O_DIRECT 1 MiB reads; prefetch and readahead off, so "
               "every hit is the policy's. Median of %s."
               % (SCAN_ROUNDS, hot, hot, SCAN_TIMED_FROM, SCAN_ROUNDS,
                  plural(reps, "repetition")))
    out.append("")
    out.append("| target | all reads MB/s | x raw | hot file MB/s | x raw | "
               "hot-file hit % |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    meds = {t: {k: med([r.get(k) for r in rs if r])
                for k in ("mbs", "hot_mbs", "hot_hit")}
            for t, rs in results.items()}
    base = meds.get("raw", {})
    for t in results:
        m = meds[t]
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            t, cell(m["mbs"]), ratio(m["mbs"], base.get("mbs")),
            cell(m["hot_mbs"]), ratio(m["hot_mbs"], base.get("hot_mbs")),
            opt(m["hot_hit"], "%.1f")))
    for t, why in skipped.items():
        out.append("| %s | %s | | | | |" % (t, why))
    out.append("")
    return out


def prepare(bench, args):
    return (args.cache_dram // 4 * (SCAN_ROUNDS * 4 + 1) * 2 + (1 << 30),
            lambda t: scan_turn(bench, t))


def run(bench, args, have_tfs):
    """The scan matrix; the report's lines."""
    return run_cache(bench, args, MATRIX, have_tfs, TARGETS, DEFAULT_REPS,
                     args.cache_dram, prepare, scan_report)
