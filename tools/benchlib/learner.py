"""learner.py: the learner matrix, swapbench with and without it.

swapbench against a small DRAM tier: cache_policy=auto with cycle
prefetch (tfs-learner) against 2q with prefetch off (tfs-nolearner).
"""

import os

from .cache import CACHE_HELP, cache_target, hit_pct, opt, run_cache
from .runner import add_size_option, cell, fmt_size, med, plural, ratio
from .swap import (SWAPPERS, add_model_options, add_swapbench_options,
                   set_swap_dir_flag, swapbench, swapper_runs)


MATRIX = "learner"
SUMMARY = "swapbench with the learner and without"

HELP = CACHE_HELP + """\
  learner      swapbench partitioned and pipelined, --learn-params (2e8)
               against --learn-dram (512M): tfs-learner (auto + cycle
               prefetch) against tfs-nolearner (2q, prefetch off) and raw.
"""

TOOLS = []

TARGETS = ["raw", "tfs-learner", "tfs-nolearner"]
DEFAULT_REPS = 1


def add_options(p):
    add_model_options(p, "learner", "2e8", "5e7", "learn",
                      "swapbench model parameters")
    add_size_option(p, "--learn-dram", "512M", "learner: tensorfs dram=")

    add_swapbench_options(p)


def learner_turn(bench, target):
    a = bench.args

    def run(directory, handle, swapper):
        out = swapbench(bench, directory, swapper, params=a.learn_params,
                        sub_group_size=a.learn_sgs)
        st = bench.tfs_stats(directory)
        if out is not None and st:
            out["hit"] = hit_pct(st["cache"]["hits"], st["cache"]["misses"])
            out["cycle"] = st["learner"]["cycle_files"]
            out["pf"] = (st["prefetch"]["issued"], st["prefetch"]["used"],
                         st["prefetch"]["late"])
        return out

    return swapper_runs(bench, target,
                        lambda: cache_target(bench, target, a.learn_dram), run)


def learner_report(results, args, reps, skipped):
    out = ["## learner: swapbench --params %s --sub-group-size %s --iters "
           "%d, dram=%s" % (args.learn_params, args.learn_sgs, args.iters,
                            fmt_size(args.learn_dram)), ""]
    out.append("tfs-learner: `cache_policy=auto` (Belady on the learned "
               "cycle) and cycle prefetch; tfs-nolearner: `cache_policy=2q,"
               "prefetch=off` (what tensorfs does without a cycle). Steady "
               "median s/iter (iterations 2..%d); x raw = raw s / target s "
               "(above 1 is faster). Median of %s."
               % (args.iters, plural(reps, "repetition")))
    out.append("")
    out.append("| target | swapper | s/iter | x raw | read GB/s | write GB/s "
               "| hit % | cycle files | prefetch issued / used / late |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for s in SWAPPERS:
        meds = {t: med([r[s]["s"] for r in rs if s in r])
                for t, rs in results.items()}
        for t, rs in results.items():
            last = next((r[s] for r in reversed(rs) if s in r), {})
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                t, s, cell(meds[t], "%.2f"), ratio(meds.get("raw"), meds[t])
                if meds[t] else "-",
                cell(med([r[s]["read"] for r in rs if s in r]), "%.2f"),
                cell(med([r[s]["write"] for r in rs if s in r]), "%.2f"),
                opt(last.get("hit"), "%.1f"), opt(last.get("cycle"), "%d"),
                " / ".join(str(v) for v in last["pf"]) if last.get("pf")
                else "-"))
    for t, why in skipped.items():
        out.append("| %s | %s | | | | | | | |" % (t, why))
    out.append("")
    return out


def prepare(bench, args):
    if not os.access(args.swapbench, os.X_OK):
        return ["## learner", "",
                "Not run: %s is not built." % args.swapbench, ""]
    set_swap_dir_flag(bench)
    return (float(args.learn_params) * 20 + (2 << 30),
            lambda t: learner_turn(bench, t))


def run(bench, args, have_tfs):
    """The learner matrix; the report's lines."""
    return run_cache(bench, args, MATRIX, have_tfs, TARGETS, DEFAULT_REPS,
                     args.learn_dram, prepare, learner_report)
