"""cycle.py: the cycle matrix, files read in order, pass after pass.

A working set of --cycle-mults times the DRAM tier, cut into files read in
order every pass, as an optimizer's state is: the learner's Belady
eviction and cycle prefetch (tfs-auto) against sampled LRU (tfs-lru).
"""

import os
import time

from .cache import (CACHE_HELP, DirectFile, add_cache_dram, cache_delta,
                    cache_target, hit_pct, opt, run_cache)
from .runner import (cell, drop_caches, fmt_size, log, med, parse_size,
                     plural, ratio)


MATRIX = "cycle"
SUMMARY = "a cycle of files read in order: the learner against LRU"

HELP = CACHE_HELP + """\
  cycle        16 files read in order pass after pass (O_DIRECT), working
               set --cycle-mults (2,4) x dram; `read` passes and `rw`
               passes (read, then write new bytes back). Hit rate and MB/s
               of the passes after the learner's two. Targets: raw,
               tfs-auto, tfs-lru. Aim: at 2x, tfs-auto >= 1.6 x tfs-lru.
"""

TOOLS = []

TARGETS = ["raw", "tfs-auto", "tfs-lru", "tfs-base-auto"]
DEFAULT_REPS = 3

CYCLE_FILES = 16         # default of --cycle-files
CYCLE_WARM_PASSES = 2    # the learner needs two passes to find the cycle
CYCLE_TIMED_PASSES = 2


def add_options(p):
    add_cache_dram(p)

    p.add_argument("--cycle-mults", default="2,4", metavar="LIST",
                   help="cycle: working sets as multiples of --cache-dram "
                        "(default 2,4)")
    p.add_argument("--cycle-files", type=int, default=CYCLE_FILES,
                   metavar="N",
                   help="cycle: files the working set is cut into (default "
                        "%d); files under a MiB are whole 64 KiB" % CYCLE_FILES)
    p.add_argument("--cycle-block", type=parse_size, default=0,
                   metavar="SIZE",
                   help="cycle: tensorfs block= (default: tensorfs's own)")


def cycle_file_size(ws, files):
    """The cycle's files share the working set: whole MiB each, or whole
    64 KiB where they are smaller than a MiB."""
    unit = 1 << 20 if ws // files >= 1 << 20 else 64 << 10
    return ws // files // unit * unit


def cycle_turn(bench, target):
    a = bench.args
    res = {}
    for mult in a.cycle_mults:
        for mode in ("read", "rw"):
            ws = a.cache_dram * mult
            fsize = cycle_file_size(ws, a.cycle_files)
            io = DirectFile(min(fsize, 1 << 20))
            directory, handle = cache_target(bench, target, a.cache_dram)
            if directory is None:
                return res
            try:
                files = [os.path.join(directory, "f%05d" % i)
                         for i in range(a.cycle_files)]
                for i, f in enumerate(files):
                    io.write(f, fsize, i)
                if target != "raw" and bench.remount(handle) is None:
                    return res
                drop_caches()
                moved, t0, before = 0, None, None
                for p in range(CYCLE_WARM_PASSES + CYCLE_TIMED_PASSES):
                    if p == CYCLE_WARM_PASSES:
                        t0 = time.monotonic()
                        before = bench.tfs_stats(directory)
                        moved = 0
                    for i, f in enumerate(files):
                        moved += io.read(f)
                        if mode == "rw":
                            io.write(f, fsize, 1000 * (p + 1) + i)
                            moved += fsize
                secs = time.monotonic() - t0
                after = bench.tfs_stats(directory)
            finally:
                took = bench.stop_target(handle)
            if took is None:
                continue
            key = "%dx-%s" % (mult, mode)
            h, m = cache_delta(before, after)
            res[key] = {"mbs": moved / secs / 1e6, "hit": hit_pct(h, m)}
            log("  %-15s %-8s %8.0f MB/s  hit %s%%" % (
                target, key, res[key]["mbs"],
                opt(res[key]["hit"], "%.1f")))
    return res


def cycle_report(results, args, reps, skipped):
    out = ["## cycle: %d files read in order, pass after pass, over "
           "dram=%s%s" % (args.cycle_files, fmt_size(args.cache_dram),
                          ", block=%s" % fmt_size(args.cycle_block)
                          if args.cycle_block else ""), ""]
    out.append("Working set %s x the DRAM tier. `read`: each pass reads "
               "every file (O_DIRECT, %s requests); `rw`: each pass reads a file "
               "and writes it back with new bytes (fsync per file), as an "
               "optimizer step does. %d warm-up passes (the learner needs "
               "two), then %d timed passes: MB/s of bytes moved, and the "
               "DRAM hit rate of those passes from `.tensorfs/stats`. "
               "tfs-auto: the learner's Belady eviction and cycle prefetch; "
               "tfs-lru: sampled LRU, prefetch and readahead off; "
               "tfs-base-auto: tfs-auto of --tensorfs-base. Median of "
               "%s; x raw and x lru are MB/s ratios."
               % (" and ".join(str(m) for m in args.cycle_mults),
                  fmt_size(min(1 << 20, cycle_file_size(
                      args.cache_dram * min(args.cycle_mults),
                      args.cycle_files))),
                  CYCLE_WARM_PASSES, CYCLE_TIMED_PASSES,
                  plural(reps, "repetition")))
    out.append("")
    out.append("| working set | target | MB/s | x raw | x lru | hit % | "
               "each repetition (MB/s / hit %) |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for mult in args.cycle_mults:
        for mode in ("read", "rw"):
            key = "%dx-%s" % (mult, mode)
            meds = {t: med([r[key]["mbs"] for r in rs if key in r])
                    for t, rs in results.items()}
            for t, rs in results.items():
                hits = med([r[key]["hit"] for r in rs
                            if key in r and r[key]["hit"] is not None])
                each = ", ".join("%s / %s" % (cell(r[key]["mbs"]),
                                              opt(r[key]["hit"], "%.1f"))
                                 if key in r else "failed" for r in rs)
                out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                    key, t, cell(meds[t]), ratio(meds[t], meds.get("raw")),
                    ratio(meds[t], meds.get("tfs-lru")) if t != "raw" else "-",
                    opt(hits, "%.1f"), each))
    for t, why in skipped.items():
        out.append("| | %s | %s | | | | |" % (t, why))
    out.append("")
    return out


def prepare(bench, args):
    return (args.cache_dram * max(args.cycle_mults) * 2 + (1 << 30),
            lambda t: cycle_turn(bench, t))


def run(bench, args, have_tfs):
    """The cycle matrix; the report's lines."""
    return run_cache(bench, args, MATRIX, have_tfs, TARGETS, DEFAULT_REPS,
                     args.cache_dram, prepare, cycle_report)
