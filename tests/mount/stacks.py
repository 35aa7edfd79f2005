#!/usr/bin/env python3
"""stacks.py PID...: each thread of each process on one line, for a test
that found a request never answered: its name, where it sleeps in the
kernel and, where gdb is installed, its user stack, innermost first:

  tid 1234 tfs-fuse  k: fuse_dev_do_read<-fuse_dev_read  u: readv<-receive<-worker_main

Threads with the same stacks are counted on one line, so that a daemon's
dozens of idle request threads take one line, not dozens, in a CI log that
keeps only its last few hundred lines."""
import os
import re
import shutil
import subprocess
import sys

FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?([A-Za-z_][\w.:]*).*?(?: at (?:\S*/)?(\S+:\d+))?$")
THREAD = re.compile(r"^Thread \d+ \(Thread 0x[0-9a-f]+ \(LWP (\d+)\)")


def kernel_stack(pid, tid):
    try:
        with open("/proc/%d/task/%d/stack" % (pid, tid)) as f:
            names = [l.split()[1].split("+")[0] for l in f if len(l.split()) > 1]
    except OSError:
        return "?"
    # the system call's entry frames say nothing
    names = [n for n in names if not n.startswith(("entry_SYSCALL", "do_syscall", "__x64_sys", "x64_sys"))]
    return "<-".join(names[:6]) or "-"


def user_stacks(pid):
    if not shutil.which("gdb"):
        return {}
    try:
        out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
                             capture_output=True, text=True, timeout=60).stdout
    except (subprocess.TimeoutExpired, OSError):
        return {}
    stacks, tid = {}, None
    for line in out.splitlines():
        m = THREAD.match(line)
        if m:
            tid = int(m.group(1))
            stacks[tid] = []
            continue
        m = FRAME.match(line)
        if m and tid is not None:
            # a frame with a source line (the daemon's own) says where
            stacks[tid].append(m.group(1) + ("@" + m.group(2) if m.group(2) else ""))
    # libc's wait and lock frames say less than who waits
    skip = re.compile(r"^(__futex|__GI_|__pthread_cond_wait_common|futex_|__lll_|___pthread|__libc_)")
    return {t: "<-".join(f for f in fr if not skip.match(f.split("@")[0])) for t, fr in stacks.items()}


def main():
    for arg in sys.argv[1:]:
        pid = int(arg)
        try:
            cmd = open("/proc/%d/cmdline" % pid).read().replace("\0", " ").strip()
            tids = sorted(int(t) for t in os.listdir("/proc/%d/task" % pid))
        except OSError:
            print("--- pid %d: gone" % pid)
            continue
        print("--- pid %d: %s" % (pid, cmd[:200]))
        users = user_stacks(pid)
        seen = {}
        for tid in tids:
            try:
                comm = open("/proc/%d/task/%d/comm" % (pid, tid)).read().strip()
            except OSError:
                continue
            line = "%-14s k: %s" % (comm, kernel_stack(pid, tid))
            if tid in users:
                line += "  u: " + users[tid]
            seen.setdefault(line, []).append(tid)
        for line, ts in seen.items():
            who = "tid %d" % ts[0] if len(ts) == 1 else "%d threads (tid %d...)" % (len(ts), ts[0])
            print("%s %s" % (who, line))


main()
