"""fio.py: the fio matrix, and the fio jobs other matrices run.

DeepSpeed's request shape (one job, libaio, O_DIRECT, 1 MiB, iodepth 8)
on one file: write-new, overwrite, then read after drop_caches, through
the raw folder, tensorfs with a large and a small DRAM tier, and
passthrough_ll. fio_job, start_writer and stop_writer run fio with other
options for the tiers, latency, s3 and dedup matrices.
"""

import json
import os
import signal
import subprocess

from .passthrough import build_passthrough
from .runner import (DESCRIPTIONS, cell, die, drop_caches, fmt_size, log,
                     medians, mem_available, parse_size, pick_targets, plural,
                     ratio_rows, row_notes, run_group)


MATRIX = "fio"
SUMMARY = "DeepSpeed's request shape through fio, O_DIRECT 1 MiB"

HELP = """\
  fio    DeepSpeed's request shape through each target: fio, one job,
         libaio, O_DIRECT, 1 MiB blocks, iodepth 8, on one file of --size
         (default 4G). Three timed steps per repetition:
           write-new  sequential write of a new file (extends the file; FUSE
                      makes extending O_DIRECT writes synchronous)
           overwrite  the same write again over the existing file (what
                      DeepSpeed does from its second iteration on)
           read       sequential read of the file, after
                      `sync; echo 3 > /proc/sys/vm/drop_caches`
         Targets: raw, tfs-bigdram (dram = 1.5 x size), tfs-smalldram
         (dram = size / 4), tfs-smalldram-scratch (the same with
         scratch=on: sync points flush no drive), passthrough_ll, and
         tfs-base-smalldram, the daemon of --tensorfs-base with dram =
         size / 4 (an A/B of a change, taking turns with tfs-smalldram).
"""

TOOLS = ["fio"]

FIO_TARGETS = ["raw", "tfs-bigdram", "tfs-smalldram", "tfs-smalldram-scratch",
               "passthrough_ll", "tfs-base-smalldram"]
FIO_DEFAULT_TARGETS = FIO_TARGETS[:5]

FIO_DEFAULT_REPS = 3

FIO_PHASES = ["write-new", "overwrite", "read"]

TARGETS = FIO_TARGETS
DEFAULT_REPS = FIO_DEFAULT_REPS


def add_options(p):
    p.add_argument("--size", type=parse_size, default=parse_size("4G"),
                   metavar="SIZE",
                   help="fio file size, K/M/G/T binary (default 4G); "
                        "tfs-bigdram gets 1.5x, tfs-smalldram 1/4 as dram")


def fio(bench, directory, rw, size):
    """One fio step; returns MB/s (10^6 bytes per second) or None."""
    job = fio_job(bench, directory, ["--filename=bench.dat", "--rw=" + rw,
                                     "--iodepth=8", "--size=%d" % size],
                  rw, size)
    if job is None:
        return None
    return job["read" if rw == "read" else "write"]["bw_bytes"] / 1e6


def fio_turn(bench, target):
    size = bench.args.size
    dram = {"tfs-bigdram": size * 3 // 2,
            "tfs-smalldram": size // 4,
            "tfs-smalldram-scratch": size // 4,
            "tfs-base-smalldram": size // 4}.get(target)
    kind = "tfs-base" if target.startswith("tfs-base") else \
        "tfs" if target.startswith("tfs") else target
    if target.endswith("-scratch"):
        kind += "-scratch"  # start_target mounts it with scratch=on
    directory, handle = bench.start_target(kind, dram)
    res = {}
    if directory is None:
        return res
    try:
        for phase, rw in (("write-new", "write"), ("overwrite", "write"),
                          ("read", "read")):
            if rw == "read":
                drop_caches()
                before = bench.tfs_stats(directory) \
                    if kind.startswith("tfs") else None
            mbs = fio(bench, directory, rw, size)
            if mbs is None:
                break
            res[phase] = mbs
            log("  %-15s %-10s %8.0f MB/s" % (target, phase, mbs))
            if rw == "read" and kind.startswith("tfs"):
                res["read_src"] = read_sources(
                    before, bench.tfs_stats(directory))
    finally:
        took = bench.stop_target(handle)
    if kind != "raw":
        if took is None:
            res.clear()
        else:
            res["umount_s"] = took
    return res


def fio_job(bench, directory, opts, what, expect=None, timeout=None):
    """One fio job, 1 MiB, libaio, O_DIRECT, with more options; returns
    its JSON job object or None. expect: bytes it must have moved."""
    cmd = ["fio", "--name=bench", "--directory=" + directory,
           "--bs=1M", "--ioengine=libaio", "--direct=1",
           "--output-format=json"] + list(opts)
    if timeout is None:
        timeout = 300 + (expect or 0) / 20e6
    try:
        r = run_group(cmd, timeout)
    except subprocess.TimeoutExpired:
        log("fio %s timed out after %d s" % (what, timeout))
        return None
    try:
        job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        log("fio %s: no result (rc %d): %s" % (what, r.returncode,
                                               r.stderr.strip()[-500:]))
        return None
    moved = job["read"]["io_bytes"] + job["write"]["io_bytes"]
    if r.returncode != 0 or job.get("error") or \
            (expect is not None and moved != expect):
        log("fio %s: rc %d, error %s, %d bytes%s: %s" % (
            what, r.returncode, job.get("error"), moved,
            "" if expect is None else " of %d" % expect,
            r.stderr.strip()[-500:]))
        return None
    return job


def start_writer(bench, directory):
    """fio writing one file over and over in the background (1 MiB,
    libaio, O_DIRECT, iodepth 8) until stop_writer."""
    cmd = ["fio", "--name=load", "--directory=" + directory,
           "--filename=load.dat", "--rw=write", "--bs=1M",
           "--ioengine=libaio", "--direct=1", "--iodepth=8",
           "--size=%d" % bench.args.lat_load_size, "--time_based",
           "--runtime=3600", "--output-format=json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    bench.helpers.append(proc)
    return proc


def stop_writer(bench, proc):
    """SIGINT ends fio's jobs and makes it print its results; returns
    the writer's MB/s over its whole run, or None."""
    if proc.poll() is not None:
        out, err = bench.stop_helper(proc)
        log("the background writer stopped early (rc %s): %s"
            % (proc.returncode, (err or "").strip()[-500:]))
        return None
    out, err = bench.stop_helper(proc, signal.SIGINT, timeout=120)
    try:
        job = json.loads(out[out.index("{"):])["jobs"][0]
        return job["write"]["bw_bytes"] / 1e6
    except (ValueError, KeyError, IndexError, TypeError):
        log("background writer: no result: %s"
            % (err or "").strip()[-500:])
        return None


def fio_report(results, args, reps, descriptions, skipped):
    size = fmt_size(args.size)
    out = []
    out.append("## fio: 1 MiB, libaio, O_DIRECT, iodepth 8, one %s file"
               % size)
    out.append("")
    out.append("Median of %s, MB/s (10^6 B/s); x raw is the ratio to the "
               "raw folder in this run." % plural(reps, "repetition"))
    out.append("")
    out.append("| target | write-new MB/s | x raw | overwrite MB/s | x raw "
               "| read MB/s | x raw |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    meds = medians(results, FIO_PHASES)
    out += ratio_rows(meds, results, skipped, FIO_PHASES, meds.get("raw", {}))
    out.append("")
    out += row_notes(results, skipped, descriptions)
    out.append("Steps: `write-new` writes a new file (FUSE serializes "
               "O_DIRECT writes that extend a file), `overwrite` writes it "
               "again in place (DeepSpeed's steady state), `read` reads it "
               "after `sync; echo 3 > /proc/sys/vm/drop_caches`. O_DIRECT "
               "keeps the kernel page cache out of every row; the drop only "
               "makes sure. tensorfs's own DRAM tier is not dropped: serving "
               "reads from it is its job, and tfs-bigdram vs tfs-smalldram "
               "shows what it is worth. tensorfs acknowledges a write once "
               "the data is in its DRAM tier (as the page cache would); its "
               "write-back finishes before unmount returns, and the "
               "unmount times below show that deferred work.")
    out.append("")
    details = ["| target | step | each repetition |", "| --- | --- | --- |"]
    for t, reps in results.items():
        for p in FIO_PHASES:
            details.append("| %s | %s | %s |" % (t, p, ", ".join(
                cell(r.get(p)) for r in reps)))
        if t != "raw":
            details.append("| %s | unmount s | %s |" % (t, ", ".join(
                cell(r.get("umount_s"), "%.1f") for r in reps)))
        if t.startswith("tfs"):
            details.append("| %s | read step: cache hits / misses, nvme "
                           "read | %s |" % (t, "; ".join(
                               r.get("read_src", "n/a") for r in reps)))
    out.append("Every repetition (MB/s; unmount s = seconds from "
               "`fusermount3 -u` until the daemon exited):")
    out.append("")
    out.extend(details)
    out.append("")
    return out


def read_sources(before, after):
    """What the read step took from where, from two stats snapshots:
    'cache hits / misses, MiB read from nvme folders'."""
    try:
        hits = after["cache"]["hits"] - before["cache"]["hits"]
        misses = after["cache"]["misses"] - before["cache"]["misses"]
        nvme = sum(t["read_bytes"] - before["tiers"][name]["read_bytes"]
                   for name, t in after["tiers"].items()
                   if name.startswith("nvme"))
    except (TypeError, KeyError):
        return "n/a"
    return "%d / %d, %.0f MiB" % (hits, misses, nvme / (1 << 20))


def run(bench, args, have_tfs):
    """The fio matrix: its targets in turn; the report's lines."""
    descriptions = dict(DESCRIPTIONS)
    skipped = {}
    targets = pick_targets(args, FIO_TARGETS, FIO_DEFAULT_TARGETS)
    reps = args.reps or FIO_DEFAULT_REPS
    descriptions["tfs-base-smalldram"] = (
        "tensorfs of --tensorfs-base (%s), dram=%s (1/4 of the file)"
        % (args.tensorfs_base, fmt_size(args.size // 4)))
    descriptions["tfs-bigdram"] = (
        "tensorfs, dram=%s (1.5 x the file): the file fits in the DRAM "
        "tier" % fmt_size(args.size * 3 // 2))
    descriptions["tfs-smalldram"] = (
        "tensorfs, dram=%s (1/4 of the file): reads come mostly from "
        "the nvme folder" % fmt_size(args.size // 4))
    descriptions["tfs-smalldram-scratch"] = (
        descriptions["tfs-smalldram"] + "; scratch=on: its sync points "
        "flush no drive")
    need = args.size * 2 + (1 << 30)
    if "tfs-base-smalldram" in targets and not (
            args.tensorfs_base and os.access(args.tensorfs_base, os.X_OK)):
        die("target tfs-base-smalldram needs --tensorfs-base PATH, a "
            "tensorfs binary to run")
    if "tfs-bigdram" in targets and \
            args.size * 3 // 2 + (2 << 30) > mem_available():
        die("tfs-bigdram needs dram=%s, more than this machine has "
            "available; use a smaller --size or leave the target out "
            "with --targets" % fmt_size(args.size * 3 // 2))
    if "passthrough_ll" in targets and bench.passthrough is None:
        bench.passthrough = build_passthrough(bench)

    def dram_of(t):
        return args.size * 3 // 2 if t == "tfs-bigdram" else args.size // 4

    results = bench.run_local("fio", targets, reps, need,
                              lambda t: fio_turn(bench, t), have_tfs,
                              skipped, dram_of)
    return fio_report(results, args, reps, descriptions, skipped)
