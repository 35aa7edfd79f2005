"""swap.py: the swap matrix, and the swapbench runs of other matrices.

swapbench (DeepSpeed ZeRO-Infinity's optimizer swapping) on the raw folder
and on tensorfs, partitioned and pipelined swappers apart: the steady
iterations' median time, and from the mount's stats, taken after each
iteration, the devices' bytes and the late prefetches of the steady
iterations. swapbench, swapper_runs (one run per swapper, each on a
fresh target) and the report's tables also serve swap-dram, swap-remote
and learner, and add_model_options gives each its model size. No fio
here.
"""

import json
import os
import re
import subprocess
import tempfile

from .passthrough import build_passthrough
from .runner import (DESCRIPTIONS, REPO, add_count_option, add_size_option,
                     cell, die, drop_caches, each_rep_table, fmt_size, log,
                     med, pick_targets, plural, ratio, row_notes, run_capture,
                     run_group)


MATRIX = "swap"
SUMMARY = "swapbench, DeepSpeed's optimizer swapping: steady s/iter"

HELP = """\
  swap   swapbench (DeepSpeed ZeRO-Infinity optimizer swapping) steady-state
         iteration time, partitioned and pipelined swapper reported apart.
         Default --params 7e8 --sub-group-size 1e8 --iters 3: about 8.4 GB
         of fp32 weights, m and v plus 2.8 GB of gradients, against
         --swap-dram 3G, so the optimizer state is more than twice the DRAM
         tier. Targets: raw, tfs (dram = --swap-dram) and tfs-scratch (the
         same with scratch=on: sync points flush no drive); add
         passthrough_ll with --targets raw,tfs,passthrough_ll, and
         tfs-base, the daemon of --tensorfs-base (another build, taking
         turns with tfs: an A/B of a change; tfs-base-scratch, the same
         with scratch=on). One
         repetition by default: each run takes minutes and already reports
         the median of its steady iterations (2..N). For tfs targets it
         also reports, from the mount's stats after each iteration, the
         devices' bytes per steady iteration (3..N, so --iters 3 or more)
         over the raw folder's, and the prefetches late (a read came while
         one was in flight) over those issued; the cycle's prefetch window
         settles over passes, so give --iters 10 or more to see its steady
         state.
"""

TOOLS = []

SWAP_TARGETS = ["raw", "tfs", "tfs-scratch", "tfs-base", "tfs-base-scratch",
                "passthrough_ll"]
SWAP_DEFAULT_TARGETS = ["raw", "tfs", "tfs-scratch"]

SWAP_DEFAULT_REPS = 1

SWAPPERS = ["partitioned", "pipelined"]

SWAPBENCH_TIMEOUT_S = 3600
STEADY_NOTE = ("they need --iters 3 or more (iterations 1 and 2 fill the "
               "tiers and learn the cycle; the steady ones are 3..N)")

TARGETS = SWAP_TARGETS
DEFAULT_REPS = SWAP_DEFAULT_REPS


def add_options(p):
    add_model_options(p, "swap", "7e8", "1e8")
    add_size_option(p, "--swap-dram", "3G", "swap: tensorfs dram=")

    add_swapbench_options(p)


def add_model_options(p, matrix, params, sgs, prefix=None,
                      what="model parameters"):
    """The size of the model matrix swaps: --PREFIX-params and
    --PREFIX-sub-group-size (args.PREFIX_params, args.PREFIX_sgs), or
    without a prefix swap's own --params and --sub-group-size."""
    flag = "--%s-" % prefix if prefix else "--"
    add_count_option(p, flag + "params", params, "%s: %s" % (matrix, what))
    add_count_option(p, flag + "sub-group-size", sgs,
                     "%s: elements per subgroup" % matrix,
                     prefix.replace("-", "_") + "_sgs" if prefix else None)


def add_swapbench_options(p):
    """The options of every matrix that runs swapbench."""
    p.add_argument("--iters", type=int, default=3, metavar="N",
                   help="swap: iterations per run, the first is not "
                        "steady state; device bytes and late prefetches "
                        "need 3 (default 3)")
    p.add_argument("--compute-gbps", type=float, default=0, metavar="G",
                   help="swap: simulated CPU Adam rate, GB of state per "
                        "second, swapbench's --compute-gbps (default 0: "
                        "none, the swap alone)")
    p.add_argument("--ranks", type=int, default=1, metavar="N",
                   help="swap: processes swapping at once, one folder each, "
                        "swapbench's --ranks; --params is all of theirs; "
                        "the report adds each rank's own steady time, the "
                        "fastest and slowest; give --iters 10 or more, the "
                        "learner's warm-up spans iterations 2-3 (default 1)")
    p.add_argument("--swapbench",
                   default=os.path.join(REPO, "build", "tools", "swapbench",
                                        "swapbench"),
                   metavar="PATH",
                   help="swapbench (default build/tools/swapbench/swapbench)")


def swap_table(results, skipped, base):
    """The swap matrices' table: per target and swapper, the median
    s/iter, base's s/iter over it, and the read and write GB/s; then the
    skipped targets."""
    hdr = "| target"
    sep = "| ---"
    for s in SWAPPERS:
        hdr += " | %s s/iter | x %s | read GB/s | write GB/s" % (s, base)
        sep += " | ---: | ---: | ---: | ---:"
    out = [hdr + " |", sep + " |"]
    meds = {t: {s: {k: med([r[s][k] for r in rs if s in r])
                    for k in ("s", "read", "write")} for s in SWAPPERS}
            for t, rs in results.items()}
    for t in results:
        row = ["| %s" % t]
        for s in SWAPPERS:
            m = meds[t][s]
            b = meds.get(base, {}).get(s, {}).get("s")
            row.append(cell(m["s"], "%.2f"))
            row.append(ratio(b, m["s"]) if m["s"] else "-")
            row.append(cell(m["read"], "%.2f"))
            row.append(cell(m["write"], "%.2f"))
        out.append(" | ".join(row) + " |")
    for t, why in skipped.items():
        out.append("| %s | %s |%s" % (t, why, " |" * 7))
    return out


def swapbench_dir_flag(bench):
    """Ask swapbench --help how it names the folder it swaps into."""
    r = run_capture([bench.args.swapbench, "--help"])
    text = (r.stdout + r.stderr) if r else ""
    for flag in ("--dir", "--nvme-path", "--path", "--directory"):
        if re.search(r"(^|\s)%s[\s=,]" % re.escape(flag), text):
            return flag
    return None


def set_swap_dir_flag(bench):
    """Set bench.swap_dir_flag from swapbench --help, or die."""
    bench.swap_dir_flag = swapbench_dir_flag(bench)
    if bench.swap_dir_flag is None:
        die("cannot tell from `swapbench --help` which option names "
            "the folder to swap into")


def swapbench(bench, directory, swapper, params=None,
              sub_group_size=None, mount=None):
    """One swapbench run. With mount (a tensorfs mount point), the
    devices' bytes (read + written, all tiers but dram) are taken from
    its stats after each iteration (between iterations by swapbench's
    --between, after the last one once swapbench is done): res["dev"] is
    the median over the steady iterations of those bytes / the raw
    folder's (the state read plus the state written), and res["late"]
    the prefetches issued and late over those iterations
    (steady_prefetch_late)."""
    a = bench.args
    cmd = [a.swapbench, bench.swap_dir_flag, directory,
           "--params", params or a.params,
           "--sub-group-size", sub_group_size or a.sub_group_size,
           "--iters", str(a.iters), "--swapper", swapper, "--json"]
    if a.compute_gbps:
        cmd += ["--compute-gbps", str(a.compute_gbps)]
    if a.ranks > 1:
        cmd += ["--ranks", str(a.ranks)]
    snaps = snap = None
    if mount:
        fd, snaps = tempfile.mkstemp(prefix="bench-snaps.")
        os.close(fd)
        snap = ("python3 -c 'import json,sys; st=json.load("
                "open(sys.argv[1])); print(sum(t[\"read_bytes\"]+t[\"write_bytes\"]"
                " for n,t in st[\"tiers\"].items() if n!=\"dram\"),"
                " st[\"prefetch\"][\"issued\"], st[\"prefetch\"][\"late\"])' "
                "%s/.tensorfs/stats >>%s" % (mount, snaps))
        cmd += ["--between", snap]
    try:
        r = run_group(cmd, SWAPBENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log("swapbench timed out: %s" % " ".join(cmd))
        return None
    if snap:
        # the snapshot after the last iteration, which --between leaves out
        run_capture(["sh", "-c", snap])
    try:
        out = json.loads(r.stdout[r.stdout.index("{"):])
        steady = out["steady"]
        res = {"s": float(steady["median_total_s"]),
               "read": float(steady["median_read_gbps"]),
               "write": float(steady["median_write_gbps"])}
        cfg = out.get("config", {})
        res["bytes"] = (cfg.get("read_bytes_per_iter"),
                        cfg.get("write_bytes_per_iter"))
        ranks = steady.get("rank_median_total_s")
        if a.ranks > 1 and ranks:
            res["ranks"] = [float(v) for v in ranks]
            res["slowest"] = slowest_ranks(out.get("iterations", []),
                                           int(steady.get("first_iter", 2)))
        if snaps:
            rows = read_snaps(snaps)
            res["dev"] = steady_device_share(rows, res["bytes"])
            res["late"] = steady_prefetch_late(rows)
    except (ValueError, KeyError, TypeError):
        log("swapbench: no result (rc %d): %s" % (
            r.returncode, r.stderr.strip()[-800:]))
        return None
    if r.returncode != 0:
        log("swapbench exited %d: %s" % (r.returncode,
                                        r.stderr.strip()[-800:]))
        return None
    return res


def swap_turn(bench, target):
    return swap_runs(bench, target, bench.args.swap_dram)


def swap_runs(bench, target, dram, params=None, sub_group_size=None):
    """swapbench with each swapper on a fresh target; swapper -> result."""
    return swapper_runs(
        bench, target, lambda: bench.start_target(target, dram),
        lambda directory, handle, swapper: swapbench(
            bench, directory, swapper, params, sub_group_size,
            mount=directory if target.startswith("tfs") else None))


def swapper_runs(bench, target, start, run):
    """Each swapper on a fresh target: start() mounts it, giving
    (directory, handle) or (None, None); host caches are dropped; then
    run(directory, handle, swapper) gives the result, or None, before
    the unmount. swapper -> result, each logged; a failed unmount drops
    that swapper's, a failed mount stops the turn."""
    res = {}
    for swapper in SWAPPERS:
        directory, handle = start()
        if directory is None:
            return res
        try:
            drop_caches()
            out = run(directory, handle, swapper)
        finally:
            took = bench.stop_target(handle)
        if out is None or took is None:
            continue
        res[swapper] = out
        log("  %-15s %-11s %7.2f s/iter  read %.2f GB/s  write %.2f GB/s"
            % (target, swapper, out["s"], out["read"], out["write"]))
    return res


def read_snaps(snaps):
    """The stats snapshots taken after each iteration (swapbench
    --between's, then swapbench's own after the last): device bytes,
    prefetches issued, late.
    A line that is not three integers is dropped. The file is removed; []
    when it cannot be read."""
    rows = []
    try:
        with open(snaps) as f:
            for line in f:
                try:
                    row = [int(x) for x in line.split()]
                except ValueError:
                    continue
                if len(row) == 3:
                    rows.append(row)
    except OSError:
        return []
    finally:
        try:
            os.unlink(snaps)
        except OSError:
            pass
    return rows


def steady_device_share(rows, per_iter):
    """Median over the steady iterations of the devices' bytes per
    iteration (from the snapshots taken after iterations 1..N) over the
    raw folder's; None when it cannot be told (N under 3: iterations 1
    and 2 fill the tiers and learn the cycle)."""
    if None in per_iter or len(rows) < 3:
        return None
    raw = per_iter[0] + per_iter[1]
    # iteration k+1's bytes are rows[k] - rows[k-1]; iteration 2 still learns
    return med([(rows[k][0] - rows[k - 1][0]) / raw
                for k in range(2, len(rows))])


def steady_prefetch_late(rows):
    """(issued, late, issued2, late2): the prefetches of the steady
    iterations the snapshots cover (3..N, as steady_device_share), then
    the same over the last two of those iterations (the last one when
    there is only one), where the cycle's window has had the most passes
    to settle (tb_cycle_pass); None when it cannot be told."""
    if len(rows) < 3:
        return None
    first, last = rows[1], rows[-1]
    tail = rows[-3] if len(rows) >= 4 else rows[1]
    return (last[1] - first[1], last[2] - first[2],
            last[1] - tail[1], last[2] - tail[2])


def slowest_ranks(iterations, first):
    """Which rank was the slowest of each steady iteration (first on), from
    swapbench's own clock per rank (rank_total_s): (how many iterations the
    rank most often the slowest was, the steady iterations, how many ranks
    were ever the slowest); None without per-rank times. A rank the mount
    starved would be the slowest of most iterations."""
    slow = []
    for it in iterations:
        rt = it.get("rank_total_s")
        if it.get("iter", 0) < first:
            continue
        if not rt:
            return None
        slow.append(max(range(len(rt)), key=lambda i: rt[i]))
    if not slow:
        return None
    return (max(slow.count(i) for i in set(slow)), len(slow), len(set(slow)))


def swap_report(results, args, reps, descriptions, skipped):
    out = []
    out.append("## swap: swapbench --params %s --sub-group-size %s "
               "--iters %d%s%s, tensorfs dram=%s"
               % (args.params, args.sub_group_size, args.iters,
                  " --compute-gbps %g" % args.compute_gbps
                  if args.compute_gbps else "",
                  " --ranks %d" % args.ranks if args.ranks > 1 else "",
                  fmt_size(args.swap_dram)))
    out.append("")
    out += per_iter_note(results, "fp32 weights, m and v are about %.1f GB. "
                         "Every byte read is checked (swapbench's default "
                         "sparse verification)."
                         % (float(args.params) * 12 / 1e9))
    out.append("Median over %s of swapbench's steady-state median "
               "iteration time (iterations 2..%d). x raw = raw seconds / "
               "target seconds (above 1 is faster than raw)."
               % (plural(reps, "repetition"), args.iters))
    out.append("")
    out += swap_table(results, skipped, "raw")
    out.append("")
    out += row_notes(results, skipped, descriptions)
    out.append("Each swapbench run gets a fresh folder (and a fresh mount); "
               "host caches are dropped before it starts.")
    out.append("")
    out += steady_table(results)
    dev = swapper_table(
        results, "dev", "Device bytes (read + written, every tier but DRAM) "
        "per steady iteration (3..%d), over the raw folder's (the state read "
        "plus the state written): median, and each repetition." % args.iters,
        "device bytes / raw | each repetition", "---: | ---",
        lambda vs: ["%.2f" % med(vs), ", ".join("%.2f" % v for v in vs)])
    out += dev
    out += swapper_table(
        results, "ranks", "Each rank's own median steady iteration "
        "(iterations 2..%d; an iteration ends when the slowest rank is "
        "done): the fastest and slowest rank, and the slowest over the "
        "fastest, each repetition." % args.iters,
        "fastest s | slowest s | slowest / fastest, each repetition",
        "---: | ---: | ---",
        lambda vs: ["%.2f" % med([min(v) for v in vs]),
                    "%.2f" % med([max(v) for v in vs]),
                    ", ".join("%.2f" % (max(v) / min(v)) if min(v) > 0
                              else "-" for v in vs)])
    out += swapper_table(
        results, "slowest", "The slowest rank of each steady iteration "
        "(iterations 2..%d, swapbench's clock per rank): how many "
        "iterations the rank most often the slowest was, and how many "
        "ranks were ever the slowest, each repetition (a starved rank "
        "would be the slowest of most)." % args.iters,
        "most often the slowest, each repetition | ranks ever the slowest",
        "--- | ---",
        lambda vs: [", ".join("%d of %d" % (v[0], v[1]) for v in vs),
                    ", ".join("%d" % v[2] for v in vs)])
    late = swapper_table(
        results, "late", "Prefetches late (a read came while the prefetch "
        "was in flight) over issued, in the steady iterations the snapshots "
        "cover (3..%d), and in the last two of them, where the window has "
        "settled: each repetition." % args.iters,
        "late / issued, 3..%d | late / issued, last two" % args.iters,
        "--- | ---",
        lambda vs: [", ".join(late_share(v[1], v[0]) for v in vs),
                    ", ".join(late_share(v[3], v[2]) for v in vs)])
    if not dev and not late and any(
            t.startswith("tfs") and any(s in r for r in rs for s in SWAPPERS)
            for t, rs in results.items()):
        out.append("Device bytes and late prefetches: not measured; %s."
                   % (STEADY_NOTE if args.iters < 3 else
                      "the mount's stats gave no snapshot (see the log)"))
        out.append("")
    out += late
    return out


def per_iter_note(results, more):
    """"Per steady iteration: X GB read, Y GB written (10^9 B); " + more,
    then a blank line, from the first run that counted its bytes; [] when
    none did."""
    per_iter = [r[s]["bytes"] for rs in results.values() for r in rs
                for s in SWAPPERS if s in r and r[s].get("bytes")]
    if not per_iter or None in per_iter[0]:
        return []
    return ["Per steady iteration: %.1f GB read, %.1f GB written (10^9 B); %s"
            % (per_iter[0][0] / 1e9, per_iter[0][1] / 1e9, more), ""]


def steady_table(results):
    """"Every repetition (steady-state s/iter)": each run's time, per
    target and swapper."""
    return ["Every repetition (steady-state s/iter):", ""] + each_rep_table(
        results, "swapper", SWAPPERS,
        lambda r, s: cell(r[s]["s"] if s in r else None, "%.2f"),
        ", ") + [""]


def swapper_table(results, key, intro, columns, align, cells):
    """A table of one figure of the swapbench runs, result[key], where any
    run has it: the intro, then a row per target and swapper with the
    cells(values of its repetitions) under columns (aligned as align);
    [] when no run has it."""
    rows = []
    for t, rs in results.items():
        for s in SWAPPERS:
            vs = [r[s][key] for r in rs if r.get(s, {}).get(key) is not None]
            if vs:
                rows.append("| %s | %s | %s |" % (t, s, " | ".join(cells(vs))))
    if not rows:
        return []
    return [intro, "", "| target | swapper | %s |" % columns,
            "| --- | --- | %s |" % align] + rows + [""]


def late_share(late, issued):
    """late/issued (share %), as the report prints it."""
    return "%d/%d (%s)" % (late, issued, "%.0f%%" % (100.0 * late / issued)
                           if issued else "-")


def run(bench, args, have_tfs):
    """The swap matrix: its targets in turn; the report's lines."""
    descriptions = dict(DESCRIPTIONS)
    skipped = {}
    targets = pick_targets(args, SWAP_TARGETS, SWAP_DEFAULT_TARGETS)
    reps = args.reps or SWAP_DEFAULT_REPS
    descriptions["tfs"] = "tensorfs, dram=%s" % fmt_size(args.swap_dram)
    descriptions["tfs-scratch"] = "tensorfs, dram=%s,scratch=on" \
        % fmt_size(args.swap_dram)
    descriptions["tfs-base"] = "tensorfs of --tensorfs-base (%s), dram=%s" \
        % (args.tensorfs_base, fmt_size(args.swap_dram))
    descriptions["tfs-base-scratch"] = descriptions["tfs-base"] + ",scratch=on"
    if any(t.startswith("tfs-base") for t in targets) and not (
            args.tensorfs_base and os.access(args.tensorfs_base, os.X_OK)):
        die("target tfs-base needs --tensorfs-base PATH, a tensorfs "
            "binary to run")
    need = 16 << 30
    if not os.access(args.swapbench, os.X_OK):
        log("swap: %s not built; skipping the swap matrix"
            % args.swapbench)
        return ["## swap", "",
                "Not run: %s is not built." % args.swapbench, ""]
    set_swap_dir_flag(bench)
    if "passthrough_ll" in targets and bench.passthrough is None:
        bench.passthrough = build_passthrough(bench)
    on_tfs = any(t.startswith("tfs") for t in targets)
    if args.iters < 3 and on_tfs:
        log("swap: --iters %d: no device bytes or late prefetches; %s"
            % (args.iters, STEADY_NOTE))
    if args.ranks > 1 and args.iters < 10 and on_tfs:
        log("swap: --ranks %d --iters %d: the steady median (iterations "
            "2..%d) is mostly the learner's warm-up of the ranks' cycles, "
            "up to twice the steady time; give --iters 10 or more"
            % (args.ranks, args.iters, args.iters))
    results = bench.run_local("swap", targets, reps, need,
                              lambda t: swap_turn(bench, t), have_tfs,
                              skipped, lambda t: args.swap_dram)
    return swap_report(results, args, reps, descriptions, skipped)
