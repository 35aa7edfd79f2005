"""cli.py: tools/bench's command line: the matrices, their options, main.

Each matrix is a module with MATRIX (its name), SUMMARY (one line),
HELP, TOOLS (programs it runs that must be on PATH), TARGETS,
DEFAULT_REPS, add_options(p) and run(bench, args, have_tfs), which returns
the report's lines. `tools/bench MATRIX --help` shows that matrix's
options, and an option of another matrix is refused, naming the
matrices that take it. "all" is fio, then swap.
"""

import argparse
import atexit
import os
import shutil
import signal
import sys

from . import (cycle, dedup, fio, latency, learner, plot, s3, scan, swap,
               swap_dram, swap_remote, tiers)
from .cycle import cycle_file_size
from .plot import plot_main, plot_next_to
from .runner import Bench, REPO, die, machine_facts, run_capture

MATRICES = {m.MATRIX: m for m in (fio, swap, swap_dram, tiers, latency,
                                  swap_remote, s3, cycle, scan, learner,
                                  dedup, plot)}
ALL = ["fio", "swap"]     # what "all" runs
DEFAULT = "fio"

TARGETS_HELP = """\
targets:
  raw             a plain folder under --dir, on the same disk and
                  filesystem as tensorfs's nvme folder
  tfs-*           the tensorfs daemon (--tensorfs), mounted in the
                  foreground with nvme= and meta= on that same disk
  passthrough_ll  libfuse's example, built from
                  /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c into
                  build-bench/, mounted with -o source=RAWDIR,cache=auto.
                  cache=auto leaves direct_io off, as tensorfs does, so
                  O_DIRECT requests reach it in parallel and bypass the page
                  cache. libfuse 3.14 hands a write's data at a buffer that
                  is not page aligned, which O_DIRECT on the backing file
                  refuses (EINVAL); the build adds one aligned copy per
                  write, a cost tensorfs pays too (it copies into its DRAM
                  arena).
"""

ABOUT = """\
Must run as root (mounts, drop_caches). Needs fusermount3; cc and
pkg-config fuse3 for the passthrough_ll target; fio only for the matrices
that run it (%s). A target whose program is missing (tensorfs or swapbench
not built yet) is reported as "not built" and the others still run.
"""

EXAMPLES = """\
examples:
  sudo tools/bench                      # fio matrix, 4G, 3 repetitions
  sudo tools/bench all --out /tmp/bench.md
  sudo tools/bench fio --size 16G --targets raw,tfs-smalldram
  sudo tools/bench tiers --tier-bw 300M
  sudo tools/bench s3 --reps 1
  sudo tools/bench s3 --s3-latency-ms 20   # as a region: 20 ms a request
  sudo tools/bench swap-dram --out /tmp/sweep.md   # and /tmp/sweep-*.svg
  tools/bench plot --embed                # redraw docs/benchmarks.md's plots
"""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that takes an option once: matrices that share
    an option (--iters, --size, --tier-dram ...) each add it."""

    def add_argument(self, *flags, **kw):
        if not hasattr(self, "bench_flags"):
            self.bench_flags = set()
        if flags and flags[0] in self.bench_flags:
            return None
        self.bench_flags.update(flags)
        return super().add_argument(*flags, **kw)


def modules_of(matrix):
    return [MATRICES[m] for m in (ALL if matrix == "all" else [matrix])]


def tools_needed(matrix):
    """The programs a matrix runs, that must be on PATH."""
    tools = ["fusermount3", "findmnt", "lsblk"]
    if any("fio" in m.TOOLS for m in modules_of(matrix)):
        tools.insert(0, "fio")
    return tools


def fio_matrices():
    return [m for m in MATRICES if "fio" in MATRICES[m].TOOLS] + ["all"]


def add_common(p, targets=None, reps=None):
    """The options of every matrix."""
    p.add_argument("--reps", type=int, metavar="N",
                   help="repetitions of each target, taken in turn; the "
                        "table shows medians (default %s)"
                        % (reps or "3 for fio, 1 for swap"))
    p.add_argument("--targets", metavar="LIST",
                   help="comma-separated subset of the matrix's targets "
                        "(%s); raw and the matrix's baselines are always "
                        "measured" % (",".join(targets) if targets else
                                      "see tools/bench MATRIX --help"))
    p.add_argument("--dir", default="/var/tmp", metavar="DIR",
                   help="where the work folder goes: the raw folder, the "
                        "nvme folders and the mount points (default "
                        "/var/tmp); put it on the disk you want measured")
    p.add_argument("--tensorfs",
                   default=os.path.join(REPO, "build", "fs", "tensorfs"),
                   metavar="PATH",
                   help="the daemon (default build/fs/tensorfs)")
    p.add_argument("--tensorfs-base", metavar="PATH",
                   help="the daemon of targets tfs-base (swap) and "
                        "tfs-base-smalldram (fio), another build measured in "
                        "turn with tfs, for an A/B of a change")
    p.add_argument("--out", metavar="FILE", help="also write the report to this file")


def matrix_parser(matrix):
    """The parser of one matrix, for its --help."""
    mods = modules_of(matrix)
    epilog = "\n".join(m.HELP for m in mods)
    if matrix in ("fio", "swap", "all"):
        epilog += "\n" + TARGETS_HELP
    if any("fio" in m.TOOLS for m in mods):
        epilog += "\nNeeds fio.\n"
    p = Parser(prog="tools/bench %s" % matrix,
               description=" ".join(m.SUMMARY for m in mods)
               if matrix != "all" else "fio, then swap.",
               epilog=epilog,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    if matrix != "plot":
        targets = [t for m in mods for t in m.TARGETS]
        add_common(p, targets, "/".join(str(m.DEFAULT_REPS) for m in mods))
    for m in mods:
        m.add_options(p)
    return p


def usage():
    """tools/bench --help: the matrices in a few lines."""
    out = ["usage: tools/bench [MATRIX] [OPTIONS]", "",
           "Benchmark tensorfs against the raw disk and a plain FUSE "
           "passthrough, and",
           "print a markdown table. `tools/bench MATRIX --help` gives a "
           "matrix's options.", "", "matrices:"]
    for name, m in MATRICES.items():
        out.append("  %-12s %s%s" % (name, m.SUMMARY,
                                      " (default)" if name == DEFAULT
                                      else ""))
        if name == "swap":
            out.append("  %-12s %s" % ("all", "fio, then swap"))
    out += ["", "options of every matrix: --reps N, --targets LIST, --dir DIR "
            "(default /var/tmp),", "  --tensorfs PATH, --tensorfs-base PATH, "
            "--out FILE (and SVGs of its tables", "  beside it)", ""]
    out.append(ABOUT % ", ".join(fio_matrices()))
    out.append(EXAMPLES)
    return "\n".join(out)


def option_owners(flag):
    """The matrices that take the option flag."""
    return [name for name in MATRICES
            if flag in matrix_parser(name)._option_string_actions]


def refuse_foreign(p, matrix, argv):
    """An error for the first option in argv that matrix does not take:
    given to another matrix's option, a run would ignore it silently. An
    abbreviation stands for the one option it begins (argparse's rule)."""
    own = matrix_parser(matrix)._option_string_actions
    known = p._option_string_actions
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        full = [flag] if flag in known else [o for o in known if o.startswith(flag)]
        if len(full) == 1 and full[0] not in own:
            p.error("%s is not an option of %s (only of %s)"
                    % (full[0], matrix, ", ".join(option_owners(full[0]))))


def parse_args(argv):
    """Every matrix's options, as one parser takes them, then a refusal of
    those the chosen matrix does not take; the checks of their values."""
    p = Parser(prog="tools/bench", usage="tools/bench [MATRIX] [OPTIONS]",
               add_help=False)
    p.add_argument("matrix", nargs="?", default=DEFAULT,
                   choices=list(MATRICES) + ["all"],
                   help="what to measure (default: fio), or plot: draw the "
                        "tables of --from")
    add_common(p)
    for m in MATRICES.values():
        m.add_options(p)

    args = p.parse_args(argv)
    refuse_foreign(p, args.matrix, argv)
    if args.reps is not None and args.reps < 1:
        p.error("--reps must be at least 1")
    if args.iters < 2:
        p.error("--iters must be at least 2 (iteration 1 is not steady)")
    if args.size < (1 << 20) or args.size % (1 << 20):
        p.error("--size must be a whole number of MiB")
    for name in ("lat_size", "lat_load_size", "s3_size", "s3_rand_reads"):
        v = getattr(args, name)
        if v < (1 << 20) or v % (1 << 20):
            p.error("--%s must be a whole number of MiB"
                    % name.replace("_", "-"))
    if args.tier_bw < (2 << 20) or args.tier_iodepth < 1 or \
            args.lat_runtime < 1 or args.lat_warmup < 0:
        p.error("--tier-bw, --tier-iodepth, --lat-runtime or --lat-warmup "
                "out of range")
    try:
        args.cycle_mults = [int(m) for m in args.cycle_mults.split(",")]
    except ValueError:
        p.error("--cycle-mults must be a comma-separated list of integers")
    try:
        args.dram_fractions = sorted(float(f) for f in
                                     args.dram_fractions.split(","))
    except ValueError:
        p.error("--dram-fractions must be a comma-separated list of numbers")
    if not args.dram_fractions or args.dram_fractions[0] <= 0:
        p.error("--dram-fractions must be positive")
    if args.cycle_files < 1 or cycle_file_size(
            args.cache_dram * min(args.cycle_mults or [1]), args.cycle_files) < 1:
        p.error("--cycle-files: the working set gives each file less than "
                "64 KiB")
    if not args.cycle_mults or min(args.cycle_mults) < 1 or \
            args.cache_dram < (64 << 20) or args.dedup_size < (1 << 20):
        p.error("--cycle-mults, --cache-dram or --dedup-size out of range")
    if args.s3_rand_size % (1 << 20) or (
            args.s3_rand_size and args.s3_rand_size < (1 << 20)):
        p.error("--s3-rand-size must be a whole number of MiB, or 0")
    if args.s3_latency_ms is not None and not \
            0 <= args.s3_latency_ms <= 60000:
        p.error("--s3-latency-ms must be 0 to 60000")
    args.dir = os.path.realpath(args.dir)
    return args


def main(argv):
    if "-h" in argv or "--help" in argv:
        named = [a for a in argv if a in MATRICES or a == "all"]
        if named:
            matrix_parser(named[0]).print_help()
        else:
            sys.stdout.write(usage())
        return 0
    args = parse_args(argv)
    if args.matrix == "plot":
        return plot_main(args)
    if os.geteuid() != 0:
        die("run as root: the runner mounts FUSE filesystems and writes "
            "/proc/sys/vm/drop_caches (sudo tools/bench ...)")
    for tool in tools_needed(args.matrix):
        if shutil.which(tool) is None:
            die("%s not found (tools/run-tests installs what is needed)"
                % tool)
    if not os.path.isdir(args.dir):
        die("--dir %s is not a folder" % args.dir)
    if args.targets:
        known = set()
        for m in MATRICES.values():
            known |= set(m.TARGETS)
        bad = [t for t in args.targets.split(",") if t.strip() not in known]
        if bad:
            die("unknown target(s): %s" % ", ".join(bad))

    bench = Bench(args)

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    atexit.register(bench.cleanup)

    report = ["# tensorfs benchmark", ""]
    report.append("`tools/bench %s`" % " ".join(argv) if argv
                  else "`tools/bench`")
    report.append("")
    report.append("| machine | |")
    report.append("| --- | --- |")
    for k, v in machine_facts(args.dir):
        report.append("| %s | %s |" % (k, v))
    have_tfs = os.access(args.tensorfs, os.X_OK)
    if have_tfs:
        r = run_capture([args.tensorfs, "--version"])
        ver = r.stdout.strip().splitlines()[0] if r and r.stdout.strip() \
            else "?"
        report.append("| tensorfs | %s |" % ver)
    report.append("")

    try:
        bench.setup()
        for m in modules_of(args.matrix):
            report.extend(m.run(bench, args, have_tfs))
    finally:
        bench.cleanup()

    text = "\n".join(report).rstrip() + "\n"
    if args.out:
        text = plot_next_to(text, args.out)
        with open(args.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 1 if bench.failed else 0
