"""runner.py: what every matrix of tools/bench shares.

The Bench object owns one run's work folder (under --dir) and everything
started in it: the FUSE mounts of the targets and their daemons, and the
helper programs (a background writer, s3rver). Each target gets a fresh
folder (and a fresh mount) for each turn, and run_matrix takes the targets
in turn, A B C A B C ..., so that drift in the machine spreads over all of
them instead of favouring one. preflight mounts a tensorfs target once
before any turn, so that a configuration its daemon refuses stops the run
at once, with the daemon's message. cleanup unmounts and removes it all;
the command runs it on every exit path, Ctrl-C included. The reports'
figures come from med (medians: every target's at once), cell and ratio,
their tables from ratio_rows and each_rep_table; machine_facts heads
each report. add_size_option and add_count_option give the matrices
their options, each default written once.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__))))

DESCRIPTIONS = {
    "raw": "plain folder on the disk, no FUSE",
    "passthrough_ll": "libfuse passthrough_ll over the raw folder: "
                      "FUSE overhead floor",
}

MOUNT_WAIT_S = 60
UMOUNT_WAIT_S = 900
UMOUNT_RETRIES = 25


def log(msg):
    print("bench: " + msg, file=sys.stderr, flush=True)


def die(msg):
    log("error: " + msg)
    sys.exit(2)


def parse_size(text):
    """'4G' -> bytes; binary suffixes K, M, G, T, optional 'iB' or 'B'."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError("bad size: %r" % text)
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(float(m.group(1)) * mult[m.group(2).upper()])


def fmt_size(n):
    """bytes -> the shortest exact K/M/G form, as tensorfs's options take."""
    for suffix, mult in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20),
                         ("K", 1 << 10)):
        if n % mult == 0:
            return "%d%s" % (n // mult, suffix)
    return str(n)


def parse_count(text):
    """'7e8' -> 700000000."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("bad number: %r" % text)
    if v <= 0 or v != int(v):
        raise argparse.ArgumentTypeError("bad number: %r" % text)
    return text


def add_size_option(p, flag, default, help, note=None):
    """An option that takes a size (4G, 512M); its default, given the same
    way, ends the help: "(default 4G)", or "(default 4G; note)"."""
    p.add_argument(flag, type=parse_size, default=parse_size(default),
                   metavar="SIZE", help="%s (default %s%s)"
                   % (help, default, "; " + note if note else ""))


def add_count_option(p, flag, default, help, dest=None):
    """An option that takes a whole number (7e8), kept as the text
    swapbench takes; its default ends the help: "(default 7e8)"."""
    p.add_argument(flag, type=parse_count, default=default, metavar="N",
                   help="%s (default %s)" % (help, default),
                   **({"dest": dest} if dest else {}))


def is_mounted(path):
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 1 and fields[1] == path:
                return True
    return False


def run_capture(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, **kw)
    except OSError:
        return None


def run_group(cmd, timeout):
    """Run a benchmark program in its own process group and capture its
    output. fio forks a process per job; if we are interrupted, or the
    program overruns its time, the whole group is killed, so no orphan
    keeps writing into a mount we are about to take down. Raises
    subprocess.TimeoutExpired on timeout."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def proc_cpu_s(pid):
    """utime + stime of a process (all its threads), in seconds, from
    /proc/PID/stat; None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3): utime and stime are 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dev_bytes(stats, key):
    """tiers.<device>.<key> for every device but dram, or None."""
    try:
        return {name: t[key] for name, t in stats["tiers"].items()
                if name != "dram"}
    except (TypeError, KeyError):
        return None


def dev_delta(before, after, key):
    a = dev_bytes(after, key)
    b = dev_bytes(before, key) or {}
    if a is None:
        return None
    return {name: v - b.get(name, 0) for name, v in a.items()}


def fmt_devs(d, unit=1 << 20, fmt="%.0f"):
    if d is None:
        return "n/a"
    return ", ".join("%s %s" % (name, fmt % (v / unit))
                     for name, v in sorted(d.items()))


def dedup_hits(stats):
    """Blocks tensorfs found it already had (dedup), or None."""
    try:
        return stats["dedup"]["hits"]
    except (TypeError, KeyError):
        return None


class Bench:
    """One run: its work folder, its mounts and helpers, and the turns."""

    def __init__(self, args):
        self.args = args
        self.work = None
        self.mounts = {}     # mount point -> Popen of its daemon
        self.failed = False
        self.seq = 0
        self.passthrough = None    # the built passthrough_ll, or None
        self.swap_dir_flag = None  # how swapbench names its folder
        self.helpers = []    # Popen of background programs we started
        self.s3 = None       # the s3rver we started: endpoint, port, ...
        self.s3_runs = 0     # s3 tiers made so far, each under its own prefix

    # ----- lifetime ---------------------------------------------------

    def setup(self):
        self.work = tempfile.mkdtemp(prefix="tfs-bench.", dir=self.args.dir)

    def cleanup(self):
        for mnt in list(self.mounts):
            self.umount(mnt, lazy=True)
        for proc in list(self.helpers):
            self.stop_helper(proc, signal.SIGKILL)
        self.s3 = None
        if self.work and os.path.isdir(self.work):
            shutil.rmtree(self.work, ignore_errors=True)
        self.work = None

    def stop_helper(self, proc, sig=signal.SIGTERM, timeout=30):
        """Signal a helper's process group and wait for it; returns its
        (stdout, stderr) when it was started with pipes."""
        out = (None, None)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        try:
            out = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out = proc.communicate()
        if proc in self.helpers:
            self.helpers.remove(proc)
        return out

    def fresh(self, name):
        self.seq += 1
        path = os.path.join(self.work, "%s.%d" % (name, self.seq))
        os.makedirs(path)
        return path

    # ----- mounting ---------------------------------------------------

    def mount(self, cmd, mnt, logpath):
        """Start a FUSE daemon in the foreground and wait for its mount."""
        logf = open(logpath, "ab")
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        logf.close()
        self.mounts[mnt] = proc
        deadline = time.monotonic() + MOUNT_WAIT_S
        while time.monotonic() < deadline:
            if is_mounted(mnt):
                return True
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        log("mount failed: %s" % " ".join(cmd))
        self.show_log(logpath)
        self.umount(mnt, lazy=True)
        return False

    def umount(self, mnt, lazy=False):
        """Unmount, wait for the daemon to write back and exit.

        Returns the seconds the daemon took to exit after the unmount (its
        write-back of dirty data), or None if something went wrong."""
        proc = self.mounts.pop(mnt, None)
        t0 = time.monotonic()
        ok = True
        # A program that just had its I/O cut short may hold the mount for
        # a moment longer ("Device or resource busy"): retry before going
        # lazy.
        tries = 1 if lazy else UMOUNT_RETRIES
        for _ in range(tries):
            if not is_mounted(mnt):
                break
            r = run_capture(["fusermount3", "-u", mnt])
            if r is not None and r.returncode == 0:
                break
            time.sleep(0.2)
        else:
            if is_mounted(mnt):
                ok = lazy
                run_capture(["fusermount3", "-u", "-z", mnt])
        if proc is not None:
            try:
                rc = proc.wait(timeout=10 if lazy else UMOUNT_WAIT_S)
                ok = ok and rc == 0
            except subprocess.TimeoutExpired:
                ok = False
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return time.monotonic() - t0 if ok else None

    @staticmethod
    def show_log(path, lines=20):
        try:
            with open(path, errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            return
        for line in tail:
            log("  | " + line.rstrip())

    # ----- targets ----------------------------------------------------

    def start_target(self, kind, dram=None):
        """Make a fresh directory for a target; mount it if it is FUSE.
        A tensorfs kind ending in -scratch mounts with scratch=on.

        Returns (directory, handle) or (None, None) on failure."""
        base = self.fresh(kind)
        if kind == "raw":
            data = os.path.join(base, "data")
            os.mkdir(data)
            return data, {"kind": kind, "base": base}
        mnt = os.path.join(base, "mnt")
        os.mkdir(mnt)
        logpath = os.path.join(base, "daemon.log")
        if kind == "passthrough_ll":
            src = os.path.join(base, "data")
            os.mkdir(src)
            cmd = [self.passthrough, "-f", "-o",
                   "source=%s,cache=auto" % src, mnt]
        else:
            nvme = os.path.join(base, "nvme0")
            meta = os.path.join(base, "meta")
            os.mkdir(nvme)
            opts = "nvme=%s,meta=%s,dram=%s" % (nvme, meta, fmt_size(dram))
            if kind.endswith("-scratch"):
                opts += ",scratch=on"
            daemon = self.args.tensorfs_base if kind.startswith("tfs-base") \
                else self.args.tensorfs
            cmd = [daemon, "-f", "-o", opts, mnt]
        if not self.mount(cmd, mnt, logpath):
            return None, None
        return mnt, {"kind": kind, "base": base, "mnt": mnt, "log": logpath}

    def preflight(self, kind, dram, target=None, start=None):
        """Mount a tensorfs target once, before any run, so that options it
        refuses (a dram= below its minimum) stop the matrix at once rather
        than after the other targets' turns; its message is in the log.
        start: how to mount it (default: start_target(kind, dram))."""
        directory, handle = start() if start else \
            self.start_target(kind, dram)
        if directory is None:
            die("target %s cannot mount with dram=%s (the daemon's message is "
                "above); nothing was run" % (target or kind, fmt_size(dram)))
        self.stop_target(handle)

    def stop_target(self, handle):
        """Unmount (if FUSE) and remove the target's folders. Returns the
        unmount time in seconds for FUSE targets, 0 for raw, None on error."""
        took = 0.0
        if "mnt" in handle:
            took = self.umount(handle["mnt"])
            if took is None:
                log("unmount of %s failed" % handle["mnt"])
                self.show_log(handle["log"])
        shutil.rmtree(handle["base"], ignore_errors=True)
        return took

    def tfs_stats(self, mnt):
        try:
            with open(os.path.join(mnt, ".tensorfs", "stats")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def start_raw(self, name="raw"):
        base = self.fresh(name)
        data = os.path.join(base, "data")
        os.mkdir(data)
        return data, {"kind": "raw", "base": base}

    def start_tfs(self, name, dram, nvme=True, pfs=False, extra=(),
                  daemon=None):
        """tensorfs in the foreground with its own nvme (or none), meta
        and pfs folders, all under one fresh folder on --dir."""
        base = self.fresh(name)
        mnt = os.path.join(base, "mnt")
        os.mkdir(mnt)
        opts = []
        if nvme:
            path = os.path.join(base, "nvme0")
            os.mkdir(path)
            opts.append("nvme=" + path)
        else:
            opts.append("nvme=none")
        opts.append("meta=" + os.path.join(base, "meta"))
        if pfs:
            path = os.path.join(base, "pfs")
            os.mkdir(path)
            opts.append("remote=" + path)
        opts.append("dram=" + fmt_size(dram))
        opts.extend(extra)
        cmd = [daemon or self.args.tensorfs, "-f", "-o", ",".join(opts), mnt]
        return self.start_fuse(cmd, base, mnt, "tfs")

    def start_fuse(self, cmd, base, mnt, kind):
        logpath = os.path.join(base, "daemon.log")
        if not self.mount(cmd, mnt, logpath):
            return None, None
        return mnt, {"kind": kind, "base": base, "mnt": mnt, "log": logpath,
                     "cmd": cmd}

    def remount(self, handle):
        """Unmount a FUSE target (its daemon writes everything back and
        exits) and mount it again on the same folders: an empty DRAM tier
        for tensorfs. Returns the unmount seconds, or None."""
        took = self.umount(handle["mnt"])
        if took is None:
            log("unmount of %s failed" % handle["mnt"])
            self.show_log(handle["log"])
            return None
        if not self.mount(handle["cmd"], handle["mnt"], handle["log"]):
            return None
        return took

    def daemon_cpu(self, handle):
        """CPU seconds (user + system) the target's daemon has used."""
        proc = self.mounts.get(handle["mnt"])
        return proc_cpu_s(proc.pid) if proc is not None else None

    # ----- the runs -----------------------------------------------------

    def run_matrix(self, targets, turn, reps):
        """Round-robin the targets reps times; returns target -> [results]."""
        results = {t: [] for t in targets}
        for rep in range(1, reps + 1):
            for t in targets:
                log("rep %d/%d: %s" % (rep, reps, t))
                res = turn(t)
                if not res:
                    self.failed = True
                results[t].append(res)
        return results

    def run_local(self, matrix, targets, reps, need, turn, have_tfs,
                  skipped, dram_of):
        """The fio and swap matrices' runs: check the room on --dir, leave
        out the targets whose program is missing, mount each tensorfs
        target once (preflight; dram_of(target) gives its dram), then the
        turns. Returns target -> [results]."""
        args = self.args
        check_room(args.dir, need, matrix)
        for t in list(targets):
            if t.startswith("tfs") and not have_tfs:
                skipped[t] = "pending: %s not built" % args.tensorfs
            elif t == "passthrough_ll" and self.passthrough is None:
                skipped[t] = "not built (see the log above)"
        for t in skipped:
            targets.remove(t)
            self.failed = self.failed or t == "passthrough_ll"
        for t in targets:
            if t.startswith("tfs"):
                kind = "tfs-base" if t.startswith("tfs-base") else "tfs"
                self.preflight(kind, dram_of(t), t)
        log("%s matrix: %s; %d repetition(s)" % (matrix, ", ".join(targets),
                                                 reps))
        return self.run_matrix(targets, turn, reps)


def machine_facts(directory):
    facts = []
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    facts.append(("CPUs", "%d (%s)" % (os.cpu_count() or 0, cpu or "?")))
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = "%.1f GiB" % (int(line.split()[1]) / (1 << 20))
    except OSError:
        pass
    facts.append(("memory", mem))
    facts.append(("kernel", platform.release()))
    src = run_capture(["findmnt", "-no", "SOURCE,FSTYPE", "--target",
                       directory])
    fsdesc = src.stdout.split() if src and src.returncode == 0 else []
    disk = "?"
    if fsdesc:
        dev = fsdesc[0]
        pk = run_capture(["lsblk", "-ndo", "PKNAME", dev])
        parent = pk.stdout.strip() if pk and pk.returncode == 0 else ""
        name = "/dev/" + parent if parent else dev
        r = run_capture(["lsblk", "-dno", "NAME,SIZE,ROTA,TRAN,MODEL", name])
        if r and r.returncode == 0 and r.stdout.strip():
            f = r.stdout.split(None, 4)
            model = f[4].strip() if len(f) > 4 else ""
            if not model:
                model = "no model string"
            disk = "%s, %s, %s (%s)" % (name, f[1],
                                        "rotational" if f[2] == "1"
                                        else "non-rotational", model)
        disk += "; %s on %s" % (fsdesc[1] if len(fsdesc) > 1 else "?", dev)
    facts.append(("disk under --dir (%s)" % directory, disk))
    for label, cmd in (("libfuse", ["pkg-config", "--modversion", "fuse3"]),
                       ("fio", ["fio", "--version"])):
        r = run_capture(cmd)
        facts.append((label, r.stdout.strip() if r and r.returncode == 0
                       else "?"))
    facts.append(("load average at start", "%.2f %.2f %.2f"
                  % os.getloadavg()))
    facts.append(("date", datetime.datetime.now().strftime("%Y-%m-%d %H:%M")))
    return facts


def plural(n, word):
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def cell(v, fmt="%.0f"):
    return fmt % v if v is not None else "failed"


def ratio(v, base):
    if v is None or not base:
        return "-"
    return "%.2f" % (v / base)


def medians(results, keys, value=dict.get):
    """target -> {key: median over its repetitions of value(rep, key)};
    a repetition without one gives None, which med leaves out."""
    return {t: {k: med([value(r, k) for r in rs]) for k in keys}
            for t, rs in results.items()}


def ratio_rows(meds, results, skipped, keys, base):
    """Table rows: per target, each key's median and its ratio to the
    base row's; then one row per skipped target with its reason."""
    rows = []
    for t in results:
        row = ["| %s" % t]
        for k in keys:
            row.append(cell(meds[t][k]))
            row.append(ratio(meds[t][k], base.get(k)))
        rows.append(" | ".join(row) + " |")
    for t, why in skipped.items():
        rows.append("| %s | %s |%s" % (t, why, " |" * (2 * len(keys) - 1)))
    return rows


def each_rep_table(results, column, keys, rep_cell, sep="; "):
    """The "each repetition" table: a row per target and key (a step,
    swapper or condition, named by column), its repetitions'
    rep_cell(rep, key) joined by sep."""
    out = ["| target | %s | each repetition |" % column, "| --- | --- | --- |"]
    for t, rs in results.items():
        for k in keys:
            out.append("| %s | %s | %s |"
                       % (t, k, sep.join(rep_cell(r, k) for r in rs)))
    return out


def row_notes(results, skipped, descriptions):
    """The "What each row is" list under a table."""
    out = ["What each row is:", ""]
    for t in list(results) + list(skipped):
        out.append("- `%s`: %s" % (t, descriptions[t]))
    out.append("")
    return out


def check_room(directory, need, matrix):
    """Die unless directory has need bytes free for matrix."""
    free = shutil.disk_usage(directory).free
    if free < need:
        die("%s has %s free, the %s matrix needs about %s"
            % (directory, fmt_size(free >> 20 << 20), matrix,
               fmt_size(int(need) >> 20 << 20)))


def check_dram(dram, option=""):
    """Die unless a dram tier of dram bytes leaves 2 GiB of this
    machine's available memory; option names the flag in the message."""
    if dram + (2 << 30) > mem_available():
        die("dram=%s is more than this machine has available%s"
            % (fmt_size(dram), option))


def pick_targets(args, all_targets, default):
    chosen = list(default)
    if args.targets:
        want = [t.strip() for t in args.targets.split(",") if t.strip()]
        chosen = ["raw"] + [t for t in all_targets if t in want and t != "raw"]
    return chosen


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0
