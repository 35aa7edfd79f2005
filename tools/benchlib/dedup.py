"""dedup.py: the dedup matrix, what dedup=off, trust and verify cost.

fio writes new bytes with an end fsync, then dd copies the file (every
block a duplicate), on each dedup= setting and raw.
"""

import os
import re
import subprocess

from .cache import CACHE_HELP, add_cache_dram, cache_target, opt, run_cache
from .fio import fio_job
from .runner import (add_size_option, cell, fmt_size, log, med, plural, ratio,
                     run_group)


MATRIX = "dedup"
SUMMARY = "writes of new and of duplicate bytes: dedup=off, trust, verify"

HELP = CACHE_HELP + """\
  dedup        fio write of --dedup-size (2G) new bytes with an end fsync,
               then a dd copy of it (all duplicate blocks): dedup=off,
               trust, verify, and raw.
"""

TOOLS = ["fio"]

TARGETS = ["raw", "tfs-dedup-off", "tfs-dedup-trust", "tfs-dedup-verify"]
DEFAULT_REPS = 3


def add_options(p):
    add_cache_dram(p)

    add_size_option(p, "--dedup-size", "2G", "dedup: the file fio writes")


def dedup_turn(bench, target):
    a = bench.args
    res = {}
    directory, handle = cache_target(bench, target, a.cache_dram)
    if directory is None:
        return res
    st = st0 = None
    try:
        job = fio_job(bench, directory, [
            "--filename=a.dat", "--rw=write", "--iodepth=8",
            "--size=%d" % a.dedup_size, "--end_fsync=1"],
            "write unique", a.dedup_size)
        if job is None:
            return res
        res["unique"] = {"mbs": job["write"]["bw_bytes"] / 1e6}
        st0 = bench.tfs_stats(directory)
        # The same bytes again, into a second file: every block is a
        # duplicate of one already stored.
        mbs = dd_direct(bench, os.path.join(directory, "a.dat"),
                             os.path.join(directory, "b.dat"),
                             a.dedup_size)
        st = bench.tfs_stats(directory)
        if mbs is not None:
            res["duplicate"] = {"mbs": mbs}
    finally:
        took = bench.stop_target(handle)
    if took is None:
        return {}
    if st0 and "unique" in res:
        res["unique"]["hits"] = st0["dedup"]["hits"]
        res["unique"]["physical"] = st0["dedup"]["physical_bytes"]
    if st and "duplicate" in res:
        res["duplicate"]["hits"] = st["dedup"]["hits"] - st0["dedup"]["hits"]
        res["duplicate"]["physical"] = st["dedup"]["physical_bytes"]
    for kind, r in res.items():
        log("  %-17s %-9s %8.0f MB/s  dedup hits %s" % (
            target, kind, r["mbs"], opt(r.get("hits"), "%d")))
    return res


def dd_direct(bench, src, dst, size):
    """dd with 1 MiB O_DIRECT reads and writes and a final fsync;
    MB/s as dd times it."""
    cmd = ["dd", "if=" + src, "of=" + dst, "bs=1M", "iflag=direct",
           "oflag=direct", "conv=fsync"]
    try:
        r = run_group(cmd, 300 + size / 5e6)
    except subprocess.TimeoutExpired:
        log("dd timed out")
        return None
    m = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", r.stderr, re.M)
    if r.returncode != 0 or not m or int(m.group(1)) != size:
        log("dd: rc %d: %s" % (r.returncode, r.stderr.strip()[-500:]))
        return None
    return size / float(m.group(2)) / 1e6


def dedup_report(results, args, reps, skipped):
    out = ["## dedup: writing %s of new bytes, then the same bytes again, "
           "dram=%s" % (fmt_size(args.dedup_size), fmt_size(args.cache_dram)),
           ""]
    out.append("`unique`: fio, libaio, O_DIRECT, 1 MiB, iodepth 8, "
               "`--end_fsync=1`, fio's random buffers (write-back and its "
               "hashing are in the time). `duplicate`: `dd bs=1M "
               "iflag=direct oflag=direct conv=fsync` of that file into a "
               "second one, so every block written is already stored. "
               "Median of %s; x raw and x off are MB/s ratios; stored MiB "
               "from `.tensorfs/stats` after the step."
               % plural(reps, "repetition"))
    out.append("")
    out.append("| data | target | MB/s | x raw | x off | dedup hits | "
               "stored MiB |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for kind in ("unique", "duplicate"):
        meds = {t: med([r[kind]["mbs"] for r in rs if kind in r])
                for t, rs in results.items()}
        for t, rs in results.items():
            last = next((r[kind] for r in reversed(rs) if kind in r), {})
            phys = last.get("physical")
            out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                kind, t, cell(meds[t]), ratio(meds[t], meds.get("raw")),
                ratio(meds[t], meds.get("tfs-dedup-off"))
                if t != "raw" else "-", opt(last.get("hits"), "%d"),
                opt(None if phys is None else phys / (1 << 20))))
    for t, why in skipped.items():
        out.append("| | %s | %s | | | | |" % (t, why))
    out.append("")
    return out


def prepare(bench, args):
    return args.dedup_size * 2 + (1 << 30), lambda t: dedup_turn(bench, t)


def run(bench, args, have_tfs):
    """The dedup matrix; the report's lines."""
    return run_cache(bench, args, MATRIX, have_tfs, TARGETS, DEFAULT_REPS,
                     args.cache_dram, prepare, dedup_report)
