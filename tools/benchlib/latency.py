"""latency.py: the latency matrix, demand reads alone and under writes.

1 MiB O_DIRECT random reads (iodepth 1) of a file out of every cache,
alone and while another fio job writes, through raw and tensorfs: fio's
completion latency p50 and p99.
"""

import signal
import time

from .fio import fio_job, start_writer, stop_writer
from .remote import REMOTE_HELP, add_tier_options, run_remote
from .runner import (add_size_option, cell, dev_delta, drop_caches,
                     each_rep_table, fmt_devs, fmt_size, log, medians, plural,
                     ratio)


MATRIX = "latency"
SUMMARY = "demand-read latency, alone and under a writer"

HELP = REMOTE_HELP + """\
  latency      demand-read latency: 1 MiB O_DIRECT random reads (iodepth 1)
               of a --lat-size file (2G) that is not in memory (tensorfs is
               remounted), alone and while another fio job writes a
               --lat-load-size file (4G) over and over. fio clat p50/p99.
               Targets: raw, tfs (nvme only, no caps).
"""

TOOLS = ["fio"]

TARGETS = ["raw", "tfs"]

LAT_CONDITIONS = ["alone", "loaded"]

DEFAULT_REPS = 3


def add_options(p):
    add_tier_options(p, caps=False)
    add_size_option(p, "--lat-size", "2G", "latency: the file read at random")
    add_size_option(p, "--lat-load-size", "4G", "latency: the file the "
                    "background writer writes over and over")
    p.add_argument("--lat-runtime", type=int, default=20, metavar="S",
                   help="latency: at most S seconds of reads per "
                        "condition (default 20)")
    p.add_argument("--lat-warmup", type=int, default=5, metavar="S",
                   help="latency: seconds the writer runs before the reads "
                        "start (default 5)")


def clat_ms(side, pct):
    try:
        return side["clat_ns"]["percentile"]["%.6f" % pct] / 1e6
    except (KeyError, TypeError):
        return None


def latency_turn(bench, target):
    a = bench.args
    size = a.lat_size
    tfs = target != "raw"
    if tfs:
        directory, handle = bench.start_tfs(target, a.tier_dram)
    else:
        directory, handle = bench.start_raw()
    res = {}
    if directory is None:
        return res
    writer = None
    ok = False
    try:
        if fio_job(bench, directory, [
                "--filename=lat.dat", "--rw=write", "--iodepth=8",
                "--size=%d" % size, "--end_fsync=1"], "layout",
                size) is None:
            return res
        for cond in LAT_CONDITIONS:
            # Out of the DRAM tier: a remount empties it.
            if tfs and bench.remount(handle) is None:
                return res
            drop_caches()
            before = bench.tfs_stats(directory) if tfs else None
            if cond == "loaded":
                writer = start_writer(bench, directory)
                time.sleep(a.lat_warmup)
                if writer.poll() is not None:
                    stop_writer(bench, writer)
                    writer = None
                    return res
            job = fio_job(bench, directory, [
                "--filename=lat.dat", "--rw=randread", "--iodepth=1",
                "--size=%d" % size, "--runtime=%d" % a.lat_runtime],
                "randread " + cond,
                timeout=a.lat_runtime + 300)
            wmbs = None
            if writer is not None:
                wmbs = stop_writer(bench, writer)
                writer = None
                if wmbs is None:
                    return res
            if job is None:
                return res
            side = job["read"]
            r = {"p50": clat_ms(side, 50), "p99": clat_ms(side, 99),
                 "mean": side["clat_ns"]["mean"] / 1e6,
                 "ios": side["total_ios"], "writer": wmbs}
            if tfs:
                after = bench.tfs_stats(directory)
                r["dev_read"] = dev_delta(before, after, "read_bytes")
                try:
                    r["misses"] = (after["cache"]["misses"]
                                   - before["cache"]["misses"])
                except (TypeError, KeyError):
                    pass
            res[cond] = r
            log("  %-15s %-7s p50 %6.2f ms  p99 %7.2f ms  %d reads%s"
                % (target, cond, r["p50"] or -1, r["p99"] or -1,
                   r["ios"], "" if wmbs is None
                   else "  writer %.0f MB/s" % wmbs))
        ok = True
    finally:
        if writer is not None:
            bench.stop_helper(writer, signal.SIGKILL)
        took = bench.stop_target(handle)
    if not ok or (tfs and took is None):
        res.clear()
    return res


def latency_report(results, args, reps, skipped):
    out = []
    out.append("## latency: 1 MiB O_DIRECT random reads of a file not in "
               "the DRAM tier, alone and under write-back")
    out.append("")
    out.append("A %s file is written (fio, 1 MiB, O_DIRECT, end_fsync), "
               "then forced out of memory (tensorfs: a remount, which "
               "empties its DRAM tier; both: drop_caches) before each "
               "condition. Reads: fio randread, 1 MiB, libaio, O_DIRECT, "
               "iodepth 1, each block of the file at most once, at most "
               "%d s. `loaded`: another fio job writes a %s file over and "
               "over (1 MiB, O_DIRECT, iodepth 8) in the same folder, "
               "started %d s before the reads and stopped after them. "
               "tensorfs: nvme only, dram=%s, no caps. Completion latency "
               "(fio clat) percentiles, ms; median of %s."
               % (fmt_size(args.lat_size), args.lat_runtime,
                  fmt_size(args.lat_load_size), args.lat_warmup,
                  fmt_size(args.tier_dram), plural(reps, "repetition")))
    out.append("")
    out.append("| target | alone p50 ms | alone p99 ms | loaded p50 ms "
               "| loaded p99 ms | p99 loaded / alone | writer MB/s (loaded) |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    meds = medians(results, [(c, k) for c in LAT_CONDITIONS
                             for k in ("p50", "p99", "mean", "writer")],
                   lambda r, ck: r[ck[0]][ck[1]] if ck[0] in r else None)
    for t in results:
        m = meds[t]
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            t, cell(m["alone", "p50"], "%.2f"), cell(m["alone", "p99"], "%.2f"),
            cell(m["loaded", "p50"], "%.2f"),
            cell(m["loaded", "p99"], "%.2f"),
            ratio(m["loaded", "p99"], m["alone", "p99"]),
            cell(m["loaded", "writer"])))
    for t, why in skipped.items():
        out.append("| %s | %s |%s" % (t, why, " |" * 5))
    out.append("")
    out.append("Every repetition (p50 / p99 / mean ms, reads done; tensorfs: "
               "cache misses and MiB read from nvme0 during the reads):")
    out.append("")
    out += each_rep_table(results, "condition", LAT_CONDITIONS, reads_cell)
    out.append("")
    return out


def reads_cell(rep, cond):
    """One repetition's reads under cond, in the "every repetition"
    table."""
    x = rep.get(cond)
    if not x:
        return "failed"
    s = "%s / %s / %.2f, %d reads" % (
        cell(x["p50"], "%.2f"), cell(x["p99"], "%.2f"), x["mean"], x["ios"])
    if "misses" in x:
        s += ", %d misses, %s MiB" % (x["misses"], fmt_devs(x.get("dev_read")))
    if x.get("writer") is not None:
        s += ", writer %.0f MB/s" % x["writer"]
    return s


def prepare(bench, args, targets, skipped):
    return (args.lat_size + args.lat_load_size + (2 << 30),
            lambda t: latency_turn(bench, t))


def run(bench, args, have_tfs):
    """The latency matrix; the report's lines."""
    return run_remote(bench, args, MATRIX, have_tfs, TARGETS, ["raw"],
                      DEFAULT_REPS, prepare, latency_report)
