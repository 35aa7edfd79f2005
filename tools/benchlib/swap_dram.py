"""swap_dram.py: the swap-dram matrix, s/iter against the DRAM tier.

swapbench on raw, then on tensorfs with dram= each of --dram-fractions of
the optimizer state (fp32 weights, m and v: 12 bytes a parameter).
"""

import os

from .runner import cell, die, fmt_size, log, med, mem_available, plural, ratio
from .swap import (SWAPPERS, SWAP_DEFAULT_REPS, add_model_options,
                   add_swapbench_options, set_swap_dir_flag, steady_table,
                   swap_runs)


MATRIX = "swap-dram"
SUMMARY = "swapbench's s/iter against dram= / the optimizer state"

HELP = """\
  swap-dram
         swapbench's steady-state iteration time against the size of the
         DRAM tier: tensorfs with dram= each of --dram-fractions
         (0.25,0.5,1,1.5) of the optimizer state (fp32 weights, m and v:
         12 bytes per parameter), against raw. --sweep-params 1e8
         --sweep-sub-group-size 25e6 --iters 3: a 1.2 GB state. One
         repetition by default.
"""

TOOLS = []
TARGETS = []
DEFAULT_REPS = SWAP_DEFAULT_REPS


def add_options(p):
    p.add_argument("--dram-fractions", default="0.25,0.5,1,1.5",
                   metavar="LIST",
                   help="swap-dram: tensorfs dram= as fractions of the "
                        "optimizer state (default 0.25,0.5,1,1.5)")
    add_model_options(p, "swap-dram", "1e8", "25e6", "sweep")

    add_swapbench_options(p)


def run(bench, args, have_tfs):
    """The swap-dram matrix: raw, then tensorfs with dram= each fraction
    of the optimizer state; the report's lines."""
    state = int(float(args.sweep_params) * 12)  # fp32 weights, m and v
    drams = {}
    for frac in args.dram_fractions:
        drams["tfs@%g" % frac] = max(int(state * frac) >> 20 << 20, 128 << 20)
    targets = ["raw"] + list(drams)
    reps = args.reps or SWAP_DEFAULT_REPS
    if not os.access(args.swapbench, os.X_OK) or not have_tfs:
        return ["## swap-dram", "",
                "Not run: %s or %s is not built." % (args.swapbench,
                                                    args.tensorfs), ""]
    if max(drams.values()) + (2 << 30) > mem_available():
        die("swap-dram: dram=%s is more than this machine has available"
            % fmt_size(max(drams.values())))
    set_swap_dir_flag(bench)
    bench.preflight("tfs", min(drams.values()), min(drams, key=drams.get))
    log("swap-dram matrix: state %s, %s; %d repetition(s)"
        % (fmt_size(state >> 20 << 20), ", ".join(targets), reps))

    def turn(target):
        return swap_runs(bench, target, drams.get(target), args.sweep_params,
                               args.sweep_sgs)

    results = bench.run_matrix(targets, turn, reps)
    return swap_dram_report(results, args, reps, state, drams)


def swap_dram_report(results, args, reps, state, drams):
    fr = args.dram_fractions
    out = ["## swap-dram: swapbench --params %s --sub-group-size %s --iters "
           "%d, dram from %g to %g x the optimizer state"
           % (args.sweep_params, args.sweep_sgs, args.iters, fr[0], fr[-1]), ""]
    out.append("The optimizer state (fp32 weights, m and v) is %.2f GB; "
               "tensorfs gets dram= each fraction of it. Median over %s of "
               "swapbench's steady-state median iteration time (iterations "
               "2..%d). x raw = raw seconds / target seconds."
               % (state / 1e9, plural(reps, "repetition"), args.iters))
    out.append("")
    hdr, sep = "| DRAM / state | dram", "| ---: | ---:"
    for s in SWAPPERS:
        hdr += " | %s s/iter | x raw" % s
        sep += " | ---: | ---:"
    out += [hdr + " |", sep + " |"]
    meds = {t: {s: med([r[s]["s"] for r in reps_ if s in r]) for s in SWAPPERS}
            for t, reps_ in results.items()}
    for t in results:
        row = ["| %s | %s" % ("raw" if t == "raw" else t.split("@")[1],
                              fmt_size(drams[t]) if t in drams else "-")]
        for s in SWAPPERS:
            row.append(cell(meds[t][s], "%.2f"))
            row.append(ratio(meds.get("raw", {}).get(s), meds[t][s])
                       if meds[t][s] else "-")
        out.append(" | ".join(row) + " |")
    out.append("")
    out += steady_table(results)
    return out
