"""s3.py: the s3 matrix, tensorfs's s3 tier against s3fs, and their s3rver.

dd writes and reads a file through tensorfs (nvme=none, remote=s3://)
and s3fs on one s3rver on 127.0.0.1 (tests/node_modules), optionally
behind tools/s3proxy.js, which delays and counts every request; then
fio's random reads of a larger file. s3_start also serves swap-remote.
"""

import os
import re
import secrets
import shutil
import subprocess
import time

from .fio import fio_job
from .remote import REMOTE_HELP, add_tier_options, run_remote
from .runner import (REPO, add_size_option, cell, dedup_hits, dev_bytes,
                     drop_caches, fmt_size, log, medians, parse_size, plural,
                     proc_cpu_s, ratio, ratio_rows, run_group)


MATRIX = "s3"
SUMMARY = "tensorfs's s3 tier against s3fs, on one s3rver"

HELP = REMOTE_HELP + """\
  s3           dd bs=1M of a --s3-size (1G) file, write with conv=fsync,
               read after a remount and drop_caches, through tensorfs
               (nvme=none, remote=s3://...) and s3fs, both on one s3rver on
               127.0.0.1 (tests/node_modules: npm ci --prefix tests); then
               the same write of a --s3-rand-size (4G; 0: skip) file and,
               after a remount, fio 1 MiB random O_DIRECT reads of
               --s3-rand-reads (1G) of it. s3fs is the Debian package
               (apt-get install s3fs); without it s3fs is reported as not
               run and the bench exits non-zero. Also the client CPU
               seconds per GB (the daemon's, from /proc/PID/stat), the
               server's (s3rver's and the proxy's, which run on the
               same cores) and, with
               --s3-latency-ms MS, the requests per GB: tools/s3proxy.js
               between the clients and s3rver holds each request MS before
               passing it on, as a region's first byte comes late, and
               counts them all. --s3-object passes s3_object=.
"""

TOOLS = ["fio"]

TARGETS = ["tfs-s3", "s3fs"]

DEFAULT_REPS = 3

S3RVER_DIR = os.path.join(REPO, "tests", "node_modules", "@20minutes",
                          "s3rver")
S3_BUCKET_TFS = "bench-tfs"
S3_BUCKET_S3FS = "bench-s3fs"
S3_START_WAIT_S = 60
S3PROXY = os.path.join(REPO, "tools", "s3proxy.js")


# s3rver, started as tests/s3/lib_s3.sh starts it (the run's own key pair
# added to its built-in account), with one compatibility fix: s3rver
# signs a bucket-level path-style request ("GET /bucket/?...") as if it had
# no trailing slash ("/bucket"), so every correctly signed SigV4 request of
# that shape fails with SignatureDoesNotMatch. s3fs sends all its bucket
# requests (the mount-time bucket check, listings) that way. When the
# server's own string to sign does not match the signature, this checks
# the path as sent (with the slash) and takes that one if it matches.
# Requests signed the way s3rver expects are untouched.
S3RVER_MAIN = r"""
const dir = process.env.S3RVER_DIR;
const { createHmac } = require("node:crypto");
require(dir + "/lib/models/account").DUMMY_ACCOUNT.createKeyPair(
    process.env.S3_BENCH_KEY, process.env.S3_BENCH_SECRET);
const v4 = require(dir + "/lib/signature/v4");
const toSign = v4.getStringToSign;
v4.getStringToSign = (cr, req) => {
    const s = toSign(cr, req);
    if (cr.uri.endsWith("/") || req.accessKeyId !== process.env.S3_BENCH_KEY)
        return s;
    const c = req.credential;
    const key = v4.getSigningKey(process.env.S3_BENCH_SECRET, c.date,
                                 c.region, c.service);
    const sig = (t) => createHmac("sha256", key).update(t, "utf8").digest("hex");
    if (sig(s) === req.signatureProvided)
        return s;
    const s2 = toSign({ ...cr, uri: cr.uri + "/" }, req);
    return sig(s2) === req.signatureProvided ? s2 : s;
};
require(dir + "/lib/cli").parseAsync(["node", "s3rver", ...process.argv.slice(1)])
    .catch((e) => { console.error("s3rver: " + e.message); process.exit(1); });
"""

PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "all_proxy", "ALL_PROXY")


def add_options(p):
    add_tier_options(p, caps=False)
    add_size_option(p, "--s3-size", "1G", "s3: the file dd writes and reads")
    add_size_option(p, "--s3-rand-size", "4G", "s3: the file read at random, "
                    "1 MiB at a time", "0: no random reads")
    add_size_option(p, "--s3-rand-reads", "1G",
                    "s3: bytes of random 1 MiB reads")
    add_s3_server_options(p)


def add_s3_server_options(p):
    """The options of the s3rver and of tensorfs's s3 tier (s3,
    swap-remote)."""
    p.add_argument("--s3-latency-ms", type=float, default=None, metavar="MS",
                   help="s3, swap-remote: put tools/s3proxy.js between the "
                        "clients and s3rver, delaying each request's first "
                        "byte by MS (as a region does; 20 is typical), and "
                        "count requests there (default: no proxy)")
    p.add_argument("--s3-object", type=parse_size, default=None,
                   metavar="SIZE",
                   help="s3, swap-remote: tensorfs s3_object= (default: "
                        "tensorfs's own)")


def start_s3fs(bench):
    base = bench.fresh("s3fs")
    mnt = os.path.join(base, "mnt")
    os.mkdir(mnt)
    cmd = ["s3fs", S3_BUCKET_S3FS, mnt, "-f", "-o",
           "url=%s,use_path_request_style,passwd_file=%s"
           % (bench.s3["endpoint"], bench.s3["passwd"])]
    return bench.start_fuse(cmd, base, mnt, "s3fs")


def s3_opts(bench, prefix):
    """The -o options of an s3 tier under prefix in the bench bucket."""
    opts = ["remote=s3://%s/%s" % (S3_BUCKET_TFS, prefix),
            "endpoint=" + bench.s3["endpoint"]]
    if bench.args.s3_object:
        opts.append("s3_object=" + fmt_size(bench.args.s3_object))
    return opts


def dd(bench, src, dst, what, expect, fsync=False):
    """dd with 1 MiB blocks; returns MB/s from dd's own timing."""
    cmd = ["dd", "if=" + src, "of=" + dst, "bs=1M"]
    if fsync:
        cmd.append("conv=fsync")
    try:
        r = run_group(cmd, 300 + expect / 5e6)
    except subprocess.TimeoutExpired:
        log("dd %s timed out" % what)
        return None
    m = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", r.stderr, re.M)
    if r.returncode != 0 or not m or int(m.group(1)) != expect:
        log("dd %s: rc %d: %s" % (what, r.returncode,
                                  r.stderr.strip()[-500:]))
        return None
    return int(m.group(1)) / float(m.group(2)) / 1e6


def s3_start(bench):
    """Start s3rver on 127.0.0.1 and a free port, with buckets for
    tensorfs and s3fs and a key pair of this run; the credentials go
    into our environment (the daemons inherit it) and a passwd file
    for s3fs. Returns None or why it could not."""
    if shutil.which("node") is None:
        return "node is not installed (apt-get install nodejs npm)"
    if not os.path.exists(os.path.join(S3RVER_DIR, "lib", "cli.js")):
        return ("s3rver is not installed: run 'npm ci --prefix tests' "
                "in %s" % REPO)
    key = "BENCH" + secrets.token_hex(6).upper()
    secret = "bench-" + secrets.token_hex(12)
    data = os.path.join(bench.work, "s3data")
    os.makedirs(data, exist_ok=True)
    logpath = os.path.join(bench.work, "s3rver.log")
    env = dict(os.environ, S3RVER_DIR=S3RVER_DIR, S3_BENCH_KEY=key,
               S3_BENCH_SECRET=secret)
    for v in PROXY_VARS:
        env.pop(v, None)
    with open(logpath, "wb") as logf:
        proc = subprocess.Popen(
            ["node", "-e", S3RVER_MAIN, "--", "-d", data, "-a",
             "127.0.0.1", "-p", "0", "--silent",
             "--configure-bucket", S3_BUCKET_TFS,
             "--configure-bucket", S3_BUCKET_S3FS],
            stdout=logf, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    bench.helpers.append(proc)
    deadline = time.monotonic() + S3_START_WAIT_S
    port = None
    while time.monotonic() < deadline and port is None:
        with open(logpath, errors="replace") as f:
            m = re.search(r"^S3rver listening on 127\.0\.0\.1:(\d+)$",
                          f.read(), re.M)
        if m:
            port = int(m.group(1))
        elif proc.poll() is not None:
            bench.show_log(logpath)
            return "s3rver exited at start"
        else:
            time.sleep(0.1)
    if port is None:
        return "s3rver did not listen within %d s" % S3_START_WAIT_S
    passwd = os.path.join(bench.work, "s3fs.passwd")
    fd = os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("%s:%s\n" % (key, secret))
    for v in PROXY_VARS:
        os.environ.pop(v, None)
    os.environ["AWS_ACCESS_KEY_ID"] = key
    os.environ["AWS_SECRET_ACCESS_KEY"] = secret
    os.environ.pop("AWS_SESSION_TOKEN", None)
    bench.s3 = {"endpoint": "http://127.0.0.1:%d" % port, "port": port,
               "passwd": passwd, "proc": proc, "proxy_log": None}
    if bench.args.s3_latency_ms is not None:
        return s3_proxy_start(bench)
    return None


def s3_proxy_start(bench):
    """Put tools/s3proxy.js in front of s3rver: each request waits
    --s3-latency-ms before it goes on, and is logged, one line each,
    so that the requests of every client are counted at one place.
    The clients get the proxy's address as their endpoint (they sign
    for it; the proxy passes the Host header on unchanged)."""
    logpath = os.path.join(bench.work, "s3proxy.out")
    reqlog = os.path.join(bench.work, "s3proxy.requests")
    open(reqlog, "w").close()
    with open(logpath, "wb") as logf:
        proc = subprocess.Popen(
            ["node", S3PROXY, "--upstream", bench.s3["endpoint"],
             "--latency-ms", "%g" % bench.args.s3_latency_ms,
             "--log", reqlog],
            stdout=logf, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
    bench.helpers.append(proc)
    deadline = time.monotonic() + S3_START_WAIT_S
    while time.monotonic() < deadline:
        with open(logpath, errors="replace") as f:
            m = re.search(r"^s3proxy listening on 127\.0\.0\.1:(\d+)$",
                          f.read(), re.M)
        if m:
            port = int(m.group(1))
            bench.s3["endpoint"] = "http://127.0.0.1:%d" % port
            bench.s3["proxy_log"] = reqlog
            bench.s3["proxy_proc"] = proc
            return None
        if proc.poll() is not None:
            bench.show_log(logpath)
            return "tools/s3proxy.js exited at start"
        time.sleep(0.1)
    return "tools/s3proxy.js did not listen within %d s" % S3_START_WAIT_S


def s3_requests(bench):
    """Requests the proxy has seen so far, or None without one."""
    path = bench.s3 and bench.s3.get("proxy_log")
    if not path:
        return None
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def server_cpu(bench):
    """CPU seconds s3rver and the proxy (when there is one) have used so
    far, from /proc/PID/stat: the server side of every s3 figure, on the
    same cores as the clients. None without a server."""
    if not bench.s3:
        return None
    total = 0.0
    for proc in (bench.s3.get("proc"), bench.s3.get("proxy_proc")):
        if proc is None:
            continue
        cpu = proc_cpu_s(proc.pid)
        if cpu is None:
            return None
        total += cpu
    return total


def s3_source(bench, size, name="s3-source.dat"):
    """A file of size random bytes on --dir (random: tensorfs stores
    an all-zero block as a hole, and shares a block it has already)."""
    path = os.path.join(bench.work, name)
    if not os.path.exists(path):
        chunk = 1 << 20
        with open(path, "wb") as f:
            for _ in range(size // chunk):
                f.write(os.urandom(chunk))
    return path


def s3_step(bench, handle, res, step, size, run):
    """Run one timed step; record its MB/s, the requests the proxy saw
    during it, the daemon's CPU seconds and the server's (s3rver and
    the proxy). False on failure."""
    req0, cpu0 = s3_requests(bench), bench.daemon_cpu(handle)
    srv0 = server_cpu(bench)
    mbs = run()
    if mbs is None:
        return False
    req1, cpu1 = s3_requests(bench), bench.daemon_cpu(handle)
    srv1 = server_cpu(bench)
    res[step] = mbs
    if srv0 is not None and srv1 is not None:
        res[step + "_srv_gb"] = (srv1 - srv0) * 1e9 / size
    if req0 is not None and req1 is not None:
        res[step + "_req_gb"] = (req1 - req0) * 1e9 / size
    if cpu0 is not None and cpu1 is not None:
        res[step + "_cpu_gb"] = (cpu1 - cpu0) * 1e9 / size
    log("  %-15s %-10s %8.1f MB/s  %s requests/GB  %s CPU s/GB  "
        "%s server CPU s/GB"
        % (handle["kind"], step, mbs,
           cell(res.get(step + "_req_gb"), "%.0f"),
           cell(res.get(step + "_cpu_gb"), "%.2f"),
           cell(res.get(step + "_srv_gb"), "%.2f")))
    return True


def s3_randread(bench, directory, size, what):
    """fio: 1 MiB random O_DIRECT reads, iodepth 8, --s3-rand-reads
    bytes of a file of size; MB/s or None."""
    a = bench.args
    job = fio_job(bench, directory, [
        "--filename=" + what, "--rw=randread", "--iodepth=8",
        "--size=%d" % size, "--io_size=%d" % a.s3_rand_reads],
        "s3 randread", a.s3_rand_reads)
    if job is None:
        return None
    return job["read"]["bw_bytes"] / 1e6


def s3_turn(bench, target):
    a = bench.args
    size = a.s3_size
    src = s3_source(bench, size)
    rsrc = s3_source(bench, a.s3_rand_size, "s3-rand.dat") \
        if a.s3_rand_size else None
    tfs = target == "tfs-s3"
    if tfs:
        directory, handle = bench.start_tfs(
            target, a.tier_dram, nvme=False,
            extra=s3_opts(bench, "run%d" % (bench.seq + 1)))
    else:
        directory, handle = start_s3fs(bench)
    res = {}
    if directory is None:
        return res
    name = "s3bench.%d.dat" % bench.seq
    path = os.path.join(directory, name)
    ok = False
    try:
        # The same source for every write, read into the page cache
        # first, so that it costs every target the same.
        with open(src, "rb") as f:
            while f.read(8 << 20):
                pass
        if not s3_step(bench, handle, res, "write", size, lambda: dd(bench, 
                src, path, "write", size, fsync=True)):
            return res
        if tfs:
            st = bench.tfs_stats(directory)
            res["s3_written"] = (dev_bytes(st, "write_bytes")
                                 or {}).get("s3")
            res["dedup"] = dedup_hits(st)
            # from the mount on: its checks, then the PUTs
            res["req_write"] = (dev_bytes(st, "requests") or {}).get("s3")
        if bench.remount(handle) is None:
            return res
        drop_caches()
        req0 = (dev_bytes(bench.tfs_stats(directory), "requests")
                or {}).get("s3") if tfs else None
        if not s3_step(bench, handle, res, "read", size, lambda: dd(bench, 
                path, "/dev/null", "read", size)):
            return res
        if tfs:
            st = bench.tfs_stats(directory)
            res["s3_read"] = (dev_bytes(st, "read_bytes") or {}).get("s3")
            req1 = (dev_bytes(st, "requests") or {}).get("s3")
            if req0 is not None and req1 is not None:
                res["req_read"] = req1 - req0
        try:
            os.unlink(path)
        except OSError:
            pass
        if rsrc:
            rname = "s3rand.%d.dat" % bench.seq
            rpath = os.path.join(directory, rname)
            rsize = a.s3_rand_size
            with open(rsrc, "rb") as f:
                while f.read(8 << 20):
                    pass
            if not s3_step(bench, handle, res, "bigwrite", rsize,
                                lambda: dd(bench, rsrc, rpath, "bigwrite",
                                                rsize, fsync=True)):
                return res
            if bench.remount(handle) is None:
                return res
            drop_caches()
            if not s3_step(bench, handle, res, "randread", a.s3_rand_reads,
                                lambda: s3_randread(bench, 
                                    directory, rsize, rname)):
                return res
            try:
                os.unlink(rpath)
            except OSError:
                pass
        ok = True
    finally:
        took = bench.stop_target(handle)
    if not ok or took is None:
        res.clear()
    return res


S3_STEPS = ["write", "read", "bigwrite", "randread"]


def s3_proxy_note(args):
    """How the clients reach s3rver, for the reports."""
    if args.s3_latency_ms is None:
        return "directly"
    return ("through tools/s3proxy.js, which holds each request %g ms "
            "before passing it on (the first byte of every answer comes that "
            "much later, as from a region) and counts every request"
            % args.s3_latency_ms)


def s3_report(results, args, reps, skipped):
    out = []
    rand = args.s3_rand_size > 0
    out.append("## s3: dd of a %s file through tensorfs and s3fs, same "
               "s3rver%s" % (fmt_size(args.s3_size),
                             "" if args.s3_latency_ms is None else
                             ", %g ms before each request" % args.s3_latency_ms))
    out.append("")
    out.append("s3rver (tests/node_modules, `npm ci --prefix tests`) on "
               "127.0.0.1, objects on --dir, reached %s. tensorfs: "
               "`nvme=none`, `remote=s3://%s/...`, `endpoint=`, dram=%s%s. "
               "s3fs: `-o url=...,use_path_request_style,passwd_file=...`, "
               "its defaults otherwise (no local cache). write: `dd bs=1M "
               "conv=fsync` of a file of random bytes (read into the page "
               "cache first); read: `dd bs=1M` to /dev/null after a remount "
               "and `sync; echo 3 > /proc/sys/vm/drop_caches`.%s MB/s as dd "
               "(fio) times it (10^6 B/s); median of %s; x s3fs = the "
               "figure / s3fs's in this run."
               % (s3_proxy_note(args), S3_BUCKET_TFS,
                  fmt_size(args.tier_dram),
                  ", s3_object=" + fmt_size(args.s3_object)
                  if args.s3_object else "",
                  (" bigwrite: the same write of a %s file; randread: fio, "
                   "1 MiB random O_DIRECT reads (libaio, iodepth 8) of %s "
                   "of it after a remount and drop_caches."
                   % (fmt_size(args.s3_rand_size),
                      fmt_size(args.s3_rand_reads))) if rand else "",
                  plural(reps, "repetition")))
    out.append("")
    steps = [st for st in S3_STEPS if rand or st in ("write", "read")]
    out.append("| target | " + " | ".join("%s MB/s | x s3fs" % st
                                          for st in steps) + " |")
    out.append("| --- |" + " ---: | ---: |" * len(steps))
    meds = medians(results, [st + sfx for st in steps
                             for sfx in ("", "_req_gb", "_cpu_gb",
                                         "_srv_gb")])
    base = meds.get("s3fs", {})
    out += ratio_rows(meds, results, skipped, steps, base)
    out.append("")
    out.append("Client CPU seconds per GB moved: the daemon's (tensorfs, "
               "s3fs) user + system time from /proc/PID/stat over the step; "
               "server CPU, s3rver's and the proxy's, which run on the same "
               "cores.%s Medians; x s3fs as above."
               % (" Requests per GB: counted at the proxy, which sees every "
                  "request, over the step." if args.s3_latency_ms is not None
                  else ""))
    out.append("")
    cols = ["CPU s/GB", "server CPU s/GB"]
    if args.s3_latency_ms is not None:
        cols.insert(0, "requests/GB")
    out.append("| target | step | " + " | ".join("%s | x s3fs" % c
                                                 for c in cols) + " |")
    out.append("| --- | --- |" + " ---: | ---: |" * len(cols))
    for t in results:
        for st in steps:
            row = ["| %s | %s" % (t, st)]
            for sfx, fmt in (("_req_gb", "%.0f"), ("_cpu_gb", "%.2f"),
                             ("_srv_gb", "%.2f")):
                if sfx == "_req_gb" and args.s3_latency_ms is None:
                    continue
                row.append(cell(meds[t][st + sfx], fmt))
                row.append(ratio(meds[t][st + sfx], base.get(st + sfx)))
            out.append(" | ".join(row) + " |")
    out.append("")
    out.append("Every repetition (MB/s, requests/GB, CPU s/GB, and the "
               "server's CPU s/GB: s3rver's and the proxy's, which share "
               "this machine's cores with the client; tensorfs: "
               "also MiB its s3 tier wrote and read, and its own count of "
               "HTTP requests, from `.tensorfs/stats`):")
    out.append("")
    out.append("| target | step | each repetition |")
    out.append("| --- | --- | --- |")
    for t, rs in results.items():
        for st in steps:
            out.append("| %s | %s | %s |" % (t, st, "; ".join(
                "%s, %s, %s, %s" % (cell(r.get(st)),
                                    cell(r.get(st + "_req_gb"), "%.0f"),
                                    cell(r.get(st + "_cpu_gb"), "%.2f"),
                                    cell(r.get(st + "_srv_gb"), "%.2f"))
                for r in rs)))
        if t == "tfs-s3":
            out.append("| %s | dedup hits | %s |" % (t, ", ".join(
                cell(r.get("dedup"), "%d") for r in rs)))
            out.append("| %s | HTTP requests per GB written / read (stats) "
                       "| %s |"
                       % (t, "; ".join("%s / %s" % tuple(
                           cell(None if r.get(k) is None
                                else r[k] * 1e9 / args.s3_size, "%.0f")
                           for k in ("req_write", "req_read"))
                           for r in rs)))
            out.append("| %s | s3 written / read, MiB | %s |" % (t, "; ".join(
                "%s / %s" % tuple(cell(None if r.get(k) is None
                                       else r[k] / (1 << 20))
                                  for k in ("s3_written", "s3_read"))
                for r in rs)))
    out.append("")
    return out


def prepare(bench, args, targets, skipped):
    why = s3_start(bench)
    if why:
        log("s3: " + why)
        return ["## s3", "", "Not run: %s." % why, ""]
    if "s3fs" in targets and shutil.which("s3fs") is None:
        skipped["s3fs"] = "not run: s3fs is not installed " \
                          "(apt-get install s3fs)"
        targets.remove("s3fs")
        bench.failed = True
    return (args.s3_size * 4 + args.s3_rand_size * 3 + (1 << 30),
            lambda t: s3_turn(bench, t))


def run(bench, args, have_tfs):
    """The s3 matrix; the report's lines."""
    return run_remote(bench, args, MATRIX, have_tfs, TARGETS,
                      ["tfs-s3", "s3fs"], DEFAULT_REPS, prepare, s3_report)
