"""swap_remote.py: the swap-remote matrix, swapbench over remote tiers.

swapbench's steady iteration time on tensorfs with nvme alone, nvme + a
pfs folder and nvme + an s3 tier (s3rver, as in the s3 matrix), under
the caps of the tiers matrix.
"""

import os

from .remote import REMOTE_HELP, add_tier_options, run_remote, tier_caps
from .runner import (cell, dedup_hits, dev_bytes, each_rep_table, fmt_devs,
                     fmt_size, log, plural)
from .s3 import (add_s3_server_options, s3_opts, s3_proxy_note, s3_requests,
                 s3_start, server_cpu)
from .swap import (SWAPPERS, add_model_options, add_swapbench_options,
                   per_iter_note, set_swap_dir_flag, swap_table, swapbench,
                   swapper_runs)


MATRIX = "swap-remote"
SUMMARY = "swapbench over nvme + pfs and nvme + s3"

HELP = REMOTE_HELP + """\
  swap-remote  swapbench steady-state iteration time, partitioned and
               pipelined, --swap-remote-params 3e8
               --swap-remote-sub-group-size 5e7 --iters 3, with
               tfs-nvme+pfs and tfs-nvme+s3 (s3_bw = X/2 on an s3 tier on
               s3rver, as in the s3 matrix, through the proxy with
               --s3-latency-ms) against tfs-nvme (caps as in tiers). One
               repetition by default.
"""

TOOLS = []

TARGETS = ["tfs-nvme", "tfs-nvme+pfs", "tfs-nvme+s3"]

DEFAULT_REPS = 1


def add_options(p):
    add_tier_options(p, caps=True)

    add_model_options(p, "swap-remote", "3e8", "5e7", "swap-remote")

    add_s3_server_options(p)
    add_swapbench_options(p)


def swap_remote_turn(bench, target):
    a = bench.args
    pfs = target == "tfs-nvme+pfs"
    s3 = target == "tfs-nvme+s3"

    def start():
        extra = tier_caps(bench, pfs, s3)
        if s3:
            bench.s3_runs += 1
            extra += s3_opts(bench, "swap%d" % bench.s3_runs)
        return bench.start_tfs(target, a.tier_dram, pfs=pfs, extra=extra)

    def run(directory, handle, swapper):
        req0, cpu0 = s3_requests(bench), bench.daemon_cpu(handle)
        srv0 = server_cpu(bench) if s3 else None
        out = swapbench(bench, directory, swapper,
                        params=a.swap_remote_params,
                        sub_group_size=a.swap_remote_sgs)
        if out is None:
            return None
        st = bench.tfs_stats(directory)
        req1, cpu1 = s3_requests(bench), bench.daemon_cpu(handle)
        if s3 and req0 is not None:
            out["s3_requests"] = req1 - req0
        if cpu0 is not None and cpu1 is not None:
            out["cpu"] = cpu1 - cpu0
        srv1 = server_cpu(bench) if srv0 is not None else None
        if srv1 is not None:
            out["srv_cpu"] = srv1 - srv0
        out["dev_read"] = dev_bytes(st, "read_bytes")
        out["dev_write"] = dev_bytes(st, "write_bytes")
        out["dedup"] = dedup_hits(st)
        return out

    return swapper_runs(bench, target, start, run)


def swap_remote_report(results, args, reps, skipped):
    x = args.tier_bw
    out = []
    out.append("## swap-remote: swapbench --params %s --sub-group-size %s "
               "--iters %d, nvme + pfs and nvme + s3 against nvme alone, "
               "dram=%s"
               % (args.swap_remote_params, args.swap_remote_sgs, args.iters,
                  fmt_size(args.tier_dram)))
    out.append("")
    out.append("Caps as in `tiers`: nvme_bw=%s (X) and, for tfs-nvme+pfs, "
               "pfs_bw=%s on a pfs folder (remote=DIR) on the same disk; for "
               "tfs-nvme+s3, s3_bw=%s on an s3 tier (remote=s3://, s3rver on "
               "127.0.0.1 as in the s3 matrix%s, reached %s). The "
               "caps count reads and writes together, so the ideal ratio is "
               "1.5. Median over %s of swapbench's steady-state median "
               "iteration time (iterations 2..%d); x tfs-nvme = tfs-nvme "
               "seconds / target seconds (above 1 is faster)."
               % (fmt_size(x), fmt_size(x // 2), fmt_size(x // 2),
                  ", s3_object=" + fmt_size(args.s3_object)
                  if args.s3_object else "", s3_proxy_note(args),
                  plural(reps, "repetition"), args.iters))
    out.append("")
    out += swap_table(results, skipped, "tfs-nvme")
    out.append("")
    out += per_iter_note(results, "swapbench checked what it read back.")
    out.append("Every run (steady s/iter; GB each device read and wrote over "
               "the whole run, from `.tensorfs/stats` before the unmount; the "
               "daemon's CPU seconds over the run, from /proc/PID/stat%s"
               % ("" if args.s3_latency_ms is None else
                  "; for tfs-nvme+s3, the requests the proxy saw") +
               "; for tfs-nvme+s3, the CPU seconds of s3rver and the proxy, "
               "which run on the same cores):")
    out.append("")
    out += each_rep_table(results, "swapper", SWAPPERS, run_cell)
    out.append("")
    return out


def run_cell(rep, swapper):
    """One swapbench run in the "every run" table."""
    x = rep.get(swapper)
    if x is None:
        return "failed"
    return ("%.2f s; read %s; written %s; dedup hits %s%s%s%s"
            % (x["s"], fmt_devs(x.get("dev_read"), 1e9, "%.1f"),
               fmt_devs(x.get("dev_write"), 1e9, "%.1f"),
               cell(x.get("dedup"), "%d"),
               "" if x.get("cpu") is None else
               "; daemon CPU %.1f s" % x["cpu"],
               "" if x.get("s3_requests") is None else
               "; %d s3 requests" % x["s3_requests"],
               "" if x.get("srv_cpu") is None else
               "; s3rver and proxy CPU %.1f s" % x["srv_cpu"]))


def prepare(bench, args, targets, skipped):
    if not os.access(args.swapbench, os.X_OK):
        log("swap-remote: %s not built" % args.swapbench)
        return ["## swap-remote", "",
                "Not run: %s is not built." % args.swapbench, ""]
    set_swap_dir_flag(bench)
    if "tfs-nvme+s3" in targets:
        why = s3_start(bench)
        if why:
            log("swap-remote: tfs-nvme+s3: " + why)
            skipped["tfs-nvme+s3"] = "not run: " + why
            targets.remove("tfs-nvme+s3")
    return (float(args.swap_remote_params) * 20 + (2 << 30),
            lambda t: swap_remote_turn(bench, t))


def run(bench, args, have_tfs):
    """The swap-remote matrix; the report's lines."""
    return run_remote(bench, args, MATRIX, have_tfs, TARGETS,
                      ["tfs-nvme"], DEFAULT_REPS, prepare,
                      swap_remote_report)
