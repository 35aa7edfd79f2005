"""remote.py: what the remote-tier matrices share.

tiers, latency, swap-remote and s3 measure tensorfs with remote tiers.

Their targets always include baselines; tensorfs gets dram=--tier-dram,
checked against the machine's memory and mounted once before any turn;
the caps (nvme_bw=, pfs_bw=, s3_bw=) come from --tier-bw.
"""

from .runner import add_size_option, check_dram, check_room, fmt_size, log

REMOTE_HELP = """\
remote-tier matrices (not part of all): X = --tier-bw (default 300M), the
nvme_bw= cap; the pfs folder gets pfs_bw = X/2. Both folders sit on the
disk under --dir, so pick X well below that disk's own bandwidth: the caps,
not the disk, must be the limit. tensorfs gets dram=--tier-dram (1G).
"""


def add_tier_options(p, caps):
    """--tier-dram, and for the matrices that cap the tiers (caps) first
    --tier-bw."""
    if caps:
        add_size_option(p, "--tier-bw", "300M",
                        "tiers, swap-remote: X, the nvme_bw= cap per "
                        "second; the pfs folder gets X/2")
    add_size_option(p, "--tier-dram", "1G",
                    "tiers, latency, swap-remote, s3: tensorfs dram=")


def tier_caps(bench, pfs, s3=False):
    x = bench.args.tier_bw
    caps = ["nvme_bw=" + fmt_size(x)]
    if pfs:
        caps.append("pfs_bw=" + fmt_size(x // 2))
    if s3:
        caps.append("s3_bw=" + fmt_size(x // 2))
    return caps


def run_remote(bench, args, matrix, have_tfs, all_targets, baselines,
               default_reps, prepare, report):
    """One remote-tier matrix: pick the targets, check memory, let
    prepare(bench, args, targets, skipped) start what it needs and give
    (room needed on --dir, turn) or the lines of a "not run" report, mount
    tensorfs once with --tier-dram, then the turns and report(...)."""
    targets = list(all_targets)
    if args.targets:
        want = [t.strip() for t in args.targets.split(",") if t.strip()]
        targets = [t for t in all_targets if t in want or t in baselines]
    reps = args.reps or default_reps
    skipped = {}
    if not have_tfs:
        log("%s: %s not built" % (matrix, args.tensorfs))
        return ["## %s" % matrix, "",
                "Not run: %s is not built." % args.tensorfs, ""]
    check_dram(args.tier_dram, " (--tier-dram)")
    got = prepare(bench, args, targets, skipped)
    if isinstance(got, list):
        return got
    need, turn = got
    check_room(args.dir, need, matrix)
    if any(t.startswith("tfs") for t in targets):
        bench.preflight("tfs", args.tier_dram, "tfs (--tier-dram)",
                        lambda: bench.start_tfs("preflight", args.tier_dram))
    log("%s matrix: %s; %d repetition(s)" % (matrix, ", ".join(targets),
                                             reps))
    results = bench.run_matrix(targets, turn, reps)
    return report(results, args, reps, skipped)
