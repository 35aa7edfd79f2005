"""tools/benchlib: the tensorfs benchmark runner behind tools/bench.

Runs a named matrix of measurements against a plain directory on the local
disk ("raw"), tensorfs in one or more configurations, and libfuse's
passthrough_ll example (the cost of FUSE alone), and prints a markdown table
with the median of each measurement and its ratio to the raw directory
measured in the same run.

runner.py holds what every matrix shares (the Bench object: the work
folder, mounts, turns taken A B C A B C, up-front mounts, medians and
table cells); cli.py the command line; each other module one matrix (fio,
swap, swap_dram, tiers, latency, swap_remote, s3, cycle, scan, learner,
dedup, plot) or what a family of them shares (remote, cache,
passthrough). A matrix module imports the runner and, where it runs
another matrix's program, that module (swapbench from swap, fio jobs
from fio); the runner imports no matrix.
"""

