#!/bin/bash
# The Grafana dashboard (tools/grafana/tensorfs.json) queries only metrics
# that a mount exports: every tensorfs_* name in its PromQL (panels and
# template variables) is in /.tensorfs/metrics. It has the panels the
# operators need (per-tier bandwidth and capacity, hit rate, dirty bytes,
# prefetch accuracy, device health), and each expression parses
# (promtool check rules, where promtool is installed). The check itself is
# shown to catch a name the mount does not export.
. "$(dirname "$0")/lib.sh"
: "${TFS_SRC:?TFS_SRC must name the source folder}"

DASH="$TFS_SRC/tools/grafana/tensorfs.json"
[ -f "$DASH" ] || fail "no dashboard at $DASH"

# check DASHBOARD METRICS: every metric the dashboard queries is exported.
check() {
	python3 - "$1" "$2" "$T/rules.yml" <<'PY'
import json, re, sys

dash = json.load(open(sys.argv[1]))
exported = set()
for line in open(sys.argv[2]):
    if line.strip() and not line.startswith("#"):
        exported.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))

exprs = []  # (where, PromQL)
def panels(ps):
    for p in ps:
        yield p
        yield from panels(p.get("panels", []))
for p in panels(dash["panels"]):
    if p.get("type") == "row":
        continue
    targets = p.get("targets", [])
    if not targets:
        sys.exit(f"panel '{p.get('title')}' has no query")
    for t in targets:
        exprs.append((f"panel '{p['title']}'", t["expr"]))
for v in dash.get("templating", {}).get("list", []):
    q = v.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    if v.get("type") == "query":
        exprs.append((f"variable ${v['name']}", q))

used = {}
for where, e in exprs:
    for name in re.findall(r"\btensorfs_[a-zA-Z0-9_:]+", e):
        used.setdefault(name, where)
missing = sorted(n for n in used if n not in exported)
if missing:
    sys.exit("the dashboard queries metrics the mount does not export: " +
             ", ".join(f"{n} ({used[n]})" for n in missing))
if len(used) < 15:
    sys.exit(f"only {len(used)} metric names found in the dashboard: the check reads it wrong")

# What operators asked for: each topic has a metric in some panel.
need = {
    "per-tier read bandwidth": "tensorfs_tier_read_bytes_total",
    "per-tier write bandwidth": "tensorfs_tier_write_bytes_total",
    "per-tier capacity": "tensorfs_tier_capacity_bytes",
    "per-tier use": "tensorfs_tier_used_bytes",
    "hit rate": "tensorfs_cache_hits_total",
    "dirty bytes": "tensorfs_cache_dirty_bytes",
    "prefetch accuracy": "tensorfs_prefetch_used_total",
    "device health": "tensorfs_tier_up",
    "device errors": "tensorfs_tier_errors_total",
    "dirty against its limit": "tensorfs_cache_dirty_limit_bytes",
    "kept bytes": "tensorfs_cache_kept_bytes",
    "refused prefetches": "tensorfs_prefetch_refused_total",
    "read latency": "tensorfs_tier_read_latency_seconds",
}
for topic, name in need.items():
    if name not in used:
        sys.exit(f"no panel shows {topic} ({name})")

# Two mounts on one node stay apart: every selector takes $mount, and
# every panel has a unit; a panel's queries share one kind of quantity
# (a counter's rate with counters' rates, a gauge with gauges), not
# bytes/s with events/s on one unitless axis.
for p in panels(dash["panels"]):
    if p.get("type") == "row":
        continue
    for t in p["targets"]:
        for s in re.findall(r"tensorfs_[a-zA-Z0-9_:]+(\{[^}]*\})?", t["expr"]):
            if 'mount=~"$mount"' not in s:
                sys.exit(f"panel '{p['title']}': a selector without mount=~\"$mount\": {t['expr']}")
    unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
    if not unit:
        sys.exit(f"panel '{p['title']}' has no unit")
    kinds = {("bytes" if "bytes" in n else "other") + ("/s" if "rate(" in t["expr"] else "")
             for t in p["targets"] for n in re.findall(r"\btensorfs_[a-zA-Z0-9_:]+", t["expr"])
             if "/" not in t["expr"]}
    if len(kinds) > 1:
        sys.exit(f"panel '{p['title']}' mixes {sorted(kinds)} on one axis")

# For promtool: each expression as a recording rule, Grafana's variables filled in.
with open(sys.argv[3], "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (where, e) in enumerate(exprs):
        if where.startswith("variable"):
            continue  # label_values() is Grafana's, not PromQL
        e = e.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$mount", ".*")
        f.write(f"      - record: dashboard:expr{i}\n        expr: {json.dumps(e)}\n")
print(f"{len(exprs)} queries, {len(used)} metrics, all exported")
PY
}

tfs_mount
# Some activity, so that rates and the learner have something to say.
dd if=/dev/urandom of="$MNT/a" bs=1M count=8 status=none || fail "writing a"
cat "$MNT/a" >/dev/null
cp "$MNT/.tensorfs/metrics" "$T/metrics" || fail "reading /.tensorfs/metrics"
check "$DASH" "$T/metrics" || fail "dashboard check"
if command -v promtool >/dev/null; then
	promtool check rules "$T/rules.yml" >"$T/promtool.out" 2>&1 ||
		fail "a dashboard expression does not parse: $(cat "$T/promtool.out")"
fi

# The check fails on a name the mount does not export.
python3 - "$DASH" "$T/bad.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = next(p for p in d["panels"] if p.get("targets"))
p["targets"][0]["expr"] = "rate(tensorfs_no_such_metric_total[5m])"
json.dump(d, open(sys.argv[2], "w"))
PY
check "$T/bad.json" "$T/metrics" >"$T/bad.out" 2>&1 && fail "the check passed a missing metric"
grep -q tensorfs_no_such_metric_total "$T/bad.out" || fail "the check did not name it: $(cat "$T/bad.out")"
tfs_umount || fail "unmount"
exit 0
