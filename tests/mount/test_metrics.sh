#!/bin/bash
# /.tensorfs/metrics in Prometheus text format: promtool check metrics
# passes on it (and on tfsctl metrics), every family has HELP and TYPE
# lines, the names follow the conventions, the byte counters agree with
# known activity and with the JSON stats, and counters only grow.
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

PROMTOOL=$(command -v promtool) ||
	skip "promtool not found (Debian: apt-get install prometheus)"

MB=$((1 << 20))
export TFS_DRAM=128M TFS_THREADS=4

# snap NAME: save the metrics as $T/NAME.prom and lint them.
snap() {
	cat "$MNT/.tensorfs/metrics" >"$T/$1.prom" || fail "cannot read .tensorfs/metrics"
	"$PROMTOOL" check metrics <"$T/$1.prom" >"$T/$1.lint" 2>&1 ||
		fail "promtool check metrics ($1): $(cat "$T/$1.lint")"
}

# metric NAME [LABELS] FILE: the value of one sample.
metric() {
	MNT="$MNT" python3 - "$@" <<'PY'
import os, sys
name, labels, path = (sys.argv[1], "", sys.argv[2]) if len(sys.argv) == 3 else sys.argv[1:4]
mount = 'mount="%s"' % os.environ["MNT"]
want = name + "{%s}" % (mount + ("," + labels if labels else ""))
for line in open(path):
    if line.startswith(want + " "):
        print(int(float(line.split()[-1])))
        break
else:
    sys.exit("no sample " + want)
PY
}

tfs_mount "readahead=0,prefetch=off"
snap start

# Known activity: 32 MiB written and flushed, evicted, read back once.
head -c $((32 * MB)) /dev/urandom >"$T/a.ref"
dd if="$T/a.ref" of="$MNT/a" bs=1M oflag=direct status=none || fail "writing a"
"$TFSCTL" -m "$MNT" flush || fail "tfsctl flush"
"$TFSCTL" -m "$MNT" evict "$MNT/a" || fail "tfsctl evict"
dd if="$MNT/a" of=/dev/null bs=1M iflag=direct status=none || fail "reading a"
snap after

w0=$(metric tensorfs_fuse_write_bytes_total "$T/start.prom")
w1=$(metric tensorfs_fuse_write_bytes_total "$T/after.prom")
[ $((w1 - w0)) -eq $((32 * MB)) ] || fail "fuse write bytes grew by $((w1 - w0)), want 32 MiB"
r0=$(metric tensorfs_tier_read_bytes_total 'tier="nvme0"' "$T/start.prom")
r1=$(metric tensorfs_tier_read_bytes_total 'tier="nvme0"' "$T/after.prom")
[ $((r1 - r0)) -eq $((32 * MB)) ] || fail "nvme0 read bytes grew by $((r1 - r0)), want 32 MiB"
nw=$(metric tensorfs_tier_write_bytes_total 'tier="nvme0"' "$T/after.prom")
[ "$nw" -ge $((32 * MB)) ] || fail "nvme0 wrote $nw bytes, want at least 32 MiB"
[ "$(metric tensorfs_cache_dirty_bytes "$T/after.prom")" -eq 0 ] || fail "dirty bytes after flush"
metric tensorfs_tier_up 'tier="nvme0"' "$T/after.prom" | grep -qx 1 || fail "nvme0 not up"
metric tensorfs_tier_inflight 'tier="nvme0",class="demand"' "$T/after.prom" >/dev/null ||
	fail "no in-flight gauge per class"

# The JSON stats and the metrics count the same bytes (no activity between).
tfs_stat_json tiers nvme0 read_bytes >"$T/json.rb" || fail "stats"
cat "$MNT/.tensorfs/metrics" >"$T/same.prom" || fail "metrics"
[ "$(cat "$T/json.rb")" -eq "$(metric tensorfs_tier_read_bytes_total 'tier="nvme0"' "$T/same.prom")" ] ||
	fail "stats and metrics disagree on nvme0 read bytes"

# Every family has HELP and TYPE; counters end in _total, only grow, and
# every name carries the tensorfs_ prefix.
python3 - "$T/start.prom" "$T/after.prom" <<'PY' || fail "metrics conventions"
import re, sys

def parse(path):
    help_, type_, samples = set(), {}, {}
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("# HELP "):
            help_.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, t = line.split()
            type_[name] = t
        elif line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return help_, type_, samples

h0, t0, s0 = parse(sys.argv[1])
h1, t1, s1 = parse(sys.argv[2])
for key in s1:
    fam = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", key).group(0)
    assert fam.startswith("tensorfs_"), "no tensorfs_ prefix: " + key
    assert fam in h1 and fam in t1, "no HELP or TYPE for " + fam
    if t1[fam] == "counter":
        assert fam.endswith("_total"), "counter without _total: " + fam
        assert key in s0, "counter sample appeared late: " + key
        assert s1[key] >= s0[key], "counter went down: %s %g -> %g" % (key, s0[key], s1[key])
assert any(t == "counter" for t in t1.values()), "no counters at all"
PY

# Every sample carries the mount point as its first label, so that two
# mounts on one node stay apart; and the metrics operators asked for are
# there (the dirty mark, kept bytes, refused prefetches, read latency).
python3 - "$T/after.prom" "$MNT" <<'PY' || fail "the mount label or a metric"
import sys
lines = [l for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
want = '{mount="%s"' % sys.argv[2]
bad = [l for l in lines if want not in l.split(" ")[0]]
assert not bad, "samples without %s}: %s" % (want, bad[:3])
names = {l.split("{")[0] for l in lines}
for m in ("tensorfs_cache_dirty_limit_bytes", "tensorfs_cache_kept_bytes",
          "tensorfs_prefetch_refused_total", "tensorfs_tier_read_latency_seconds"):
    assert m in names, "no " + m
PY

# tfsctl metrics prints the same format.
"$TFSCTL" -m "$MNT" metrics >"$T/tfsctl.prom" || fail "tfsctl metrics"
"$PROMTOOL" check metrics <"$T/tfsctl.prom" >"$T/tfsctl.lint" 2>&1 ||
	fail "promtool check metrics (tfsctl metrics): $(cat "$T/tfsctl.lint")"
grep -q "^tensorfs_tier_read_bytes_total{mount=\"$MNT\",tier=\"nvme0\"} " "$T/tfsctl.prom" ||
	fail "tfsctl metrics lacks tensorfs_tier_read_bytes_total for nvme0"
tfs_umount || fail "unmount"
echo "PASS: metrics"
