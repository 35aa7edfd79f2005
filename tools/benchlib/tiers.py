"""tiers.py: the tiers matrix, nvme alone against nvme + pfs under caps.

fio writes one file (with a final fsync in the timed step) and, after a
remount and drop_caches, reads it, through raw, tensorfs on nvme capped
at X = --tier-bw, and tensorfs on nvme plus a pfs folder capped at X/2.
"""

from .fio import fio_job
from .remote import REMOTE_HELP, add_tier_options, run_remote, tier_caps
from .runner import (add_size_option, cell, dedup_hits, dev_bytes, dev_delta,
                     drop_caches, each_rep_table, fmt_devs, fmt_size, log,
                     medians, plural, ratio)


MATRIX = "tiers"
SUMMARY = "fio through nvme, and nvme + pfs, under bandwidth caps"

HELP = REMOTE_HELP + """\
  tiers        fio, libaio, O_DIRECT, 1 MiB, iodepth --tier-iodepth (8), one
               --size file (4G): sequential write with a final fsync in the
               timed step, then, after a remount (empty DRAM tier) and
               drop_caches, sequential read. Targets: raw, tfs-nvme
               (nvme_bw=X), tfs-nvme+pfs (nvme_bw=X, remote=PFSDIR,
               pfs_bw=X/2). Ratios against X + X/2 and against tfs-nvme;
               bytes per device from .tensorfs/stats.
"""

TOOLS = ["fio"]

TARGETS = ["raw", "tfs-nvme", "tfs-nvme+pfs"]

DEFAULT_REPS = 3


def add_options(p):
    add_tier_options(p, caps=True)
    add_size_option(p, "--size", "4G", "tiers: the file fio writes and reads")
    p.add_argument("--tier-iodepth", type=int, default=8, metavar="N",
                   help="tiers: fio iodepth (default 8)")


def tiers_turn(bench, target):
    a = bench.args
    if target == "raw":
        directory, handle = bench.start_raw()
    else:
        pfs = target == "tfs-nvme+pfs"
        directory, handle = bench.start_tfs(
            target, a.tier_dram, pfs=pfs, extra=tier_caps(bench, pfs))
    res = {}
    if directory is None:
        return res
    tfs = target != "raw"
    took = 0.0
    try:
        if not tiers_step(bench, directory, target, "write", res):
            return res
        if tfs:
            st = bench.tfs_stats(directory)
            res["dev_write"] = dev_bytes(st, "write_bytes")
            res["dedup"] = dedup_hits(st)
            took = bench.remount(handle)
            if took is None:
                res.clear()
                return res
            res["remount_s"] = took
        drop_caches()
        before = bench.tfs_stats(directory) if tfs else None
        if not tiers_step(bench, directory, target, "read", res):
            return res
        if tfs:
            after = bench.tfs_stats(directory)
            res["dev_read"] = dev_delta(before, after, "read_bytes")
            try:
                res["hits"] = (after["cache"]["hits"]
                               - before["cache"]["hits"],
                               after["cache"]["misses"]
                               - before["cache"]["misses"])
            except (TypeError, KeyError):
                pass
    finally:
        took = bench.stop_target(handle)
    if tfs:
        if took is None:
            res.clear()
        else:
            res["umount_s"] = took
    return res


def tiers_step(bench, directory, target, step, res):
    """fio's write (with a final fsync) or read of the --size file
    tiers.dat: its MB/s into res[step], logged; False if fio failed."""
    a = bench.args
    opts = ["--filename=tiers.dat", "--rw=" + step,
            "--iodepth=%d" % a.tier_iodepth, "--size=%d" % a.size]
    if step == "write":
        opts.append("--end_fsync=1")
    job = fio_job(bench, directory, opts, step, a.size)
    if job is None:
        return False
    res[step] = job[step]["bw_bytes"] / 1e6
    log("  %-15s %-10s %8.0f MB/s" % (target, step, res[step]))
    return True


def tiers_report(results, args, reps, skipped):
    x = args.tier_bw
    caps = {"tfs-nvme": x / 1e6, "tfs-nvme+pfs": (x + x // 2) / 1e6}
    out = []
    out.append("## tiers: nvme + pfs against nvme alone, fio 1 MiB, libaio, "
               "O_DIRECT, iodepth %d, one %s file"
               % (args.tier_iodepth, fmt_size(args.size)))
    out.append("")
    out.append("Caps: nvme_bw=%s (X) on the nvme folder, pfs_bw=%s (X/2) on "
               "the pfs folder (remote=DIR); both folders and the raw folder "
               "are on the same disk, under --dir. tensorfs dram=%s. Write: "
               "sequential, new file, with a final fsync inside the timed "
               "step (fio end_fsync=1), so the figure includes writing back "
               "everything. Read: after a remount (empty DRAM tier) and "
               "`sync; echo 3 > /proc/sys/vm/drop_caches`. Median of %s, "
               "MB/s (10^6 B/s)."
               % (fmt_size(x), fmt_size(x // 2), fmt_size(args.tier_dram),
                  plural(reps, "repetition")))
    out.append("")
    out.append("x caps = MB/s / the sum of the target's caps (X = %.1f MB/s, "
               "X + X/2 = %.1f MB/s); x tfs-nvme = MB/s / tfs-nvme's MB/s in "
               "this run."
               % (caps["tfs-nvme"], caps["tfs-nvme+pfs"]))
    out.append("")
    out.append("| target | caps MB/s | write MB/s | x caps | x tfs-nvme "
               "| read MB/s | x caps | x tfs-nvme |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    meds = medians(results, ("write", "read"))
    base = meds.get("tfs-nvme", {})
    for t in results:
        cap = caps.get(t)
        row = ["| %s" % t, "%.1f" % cap if cap else "none"]
        for p in ("write", "read"):
            row.append(cell(meds[t][p]))
            row.append(ratio(meds[t][p], cap) if cap else "-")
            row.append(ratio(meds[t][p], base.get(p)) if cap else "-")
        out.append(" | ".join(row) + " |")
    for t, why in skipped.items():
        out.append("| %s | %s |%s" % (t, why, " |" * 6))
    out.append("")
    out.append("Bytes each device moved (tensorfs's "
               "`.tensorfs/stats`, `tiers.<device>.write_bytes` after the "
               "write step, `read_bytes` during the read step), MiB; the "
               "read step's cache hits / misses; blocks the write step did "
               "not store because tensorfs already held them (dedup hits):")
    out.append("")
    out.append("| target | rep | written, MiB | read, MiB | hits / misses "
               "| dedup hits | unmount s |")
    out.append("| --- | ---: | --- | --- | --- | ---: | ---: |")
    for t, rs in results.items():
        if t == "raw":
            continue
        for i, r in enumerate(rs, 1):
            hm = r.get("hits")
            out.append("| %s | %d | %s | %s | %s | %s | %s |" % (
                t, i, fmt_devs(r.get("dev_write")),
                fmt_devs(r.get("dev_read")),
                "%d / %d" % hm if hm else "n/a",
                cell(r.get("dedup"), "%d"),
                cell(r.get("umount_s"), "%.1f")))
    out.append("")
    out.append("Every repetition (MB/s):")
    out.append("")
    out += each_rep_table(results, "step", ("write", "read"),
                          lambda r, p: cell(r.get(p)), ", ")
    out.append("")
    return out


def prepare(bench, args, targets, skipped):
    return args.size * 2 + (1 << 30), lambda t: tiers_turn(bench, t)


def run(bench, args, have_tfs):
    """The tiers matrix; the report's lines."""
    return run_remote(bench, args, MATRIX, have_tfs, TARGETS,
                      ["raw", "tfs-nvme"], DEFAULT_REPS, prepare,
                      tiers_report)
