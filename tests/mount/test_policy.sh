#!/bin/bash
# Scan resistance of the eviction policy without a learned cycle. A hot
# file of a quarter of the DRAM tier is read between scans of files read
# only once, each scan as large as the DRAM tier. LRU and CLOCK evict the
# hot file during every scan; 2Q keeps it in Am once it has been used
# again after leaving A1in, so from the third round on its reads hit.
# auto falls back to 2Q because no cycle repeats here. Reads are O_DIRECT
# so the kernel's page cache stays out of it; readahead and prefetch are
# off so that every hit is the policy's.
. "$(dirname "$0")/lib.sh"

ROUNDS=5
SCAN_FILES=4 # per round, 8 MiB each: 32 MiB, the whole DRAM tier
export TFS_DRAM=32M TFS_THREADS=4

rd() {
	dd if="$MNT/$1" of=/dev/null bs=1M iflag=direct status=none || fail "reading $1"
}

tfs_mount "readahead=0"
dd if=/dev/urandom of="$MNT/hot" bs=1M count=8 oflag=direct conv=fsync status=none ||
	fail "writing hot"
for i in $(seq 1 $((ROUNDS * SCAN_FILES))); do
	dd if=/dev/urandom of="$MNT/s$i" bs=1M count=8 oflag=direct conv=fsync status=none ||
		fail "writing s$i"
done
tfs_umount || fail "unmount"

# hot_hits POLICY: percent of the hot file's block reads that hit, rounds 3 on.
hot_hits() {
	local r i h0 m0 hits=0 misses=0 n=1
	tfs_mount "readahead=0,prefetch=off,cache_policy=$1"
	for r in $(seq 1 $ROUNDS); do
		h0=$(tfs_stat_json cache hits) && m0=$(tfs_stat_json cache misses) || fail "stats"
		rd hot
		if [ "$r" -ge 3 ]; then
			hits=$((hits + $(tfs_stat_json cache hits) - h0))
			misses=$((misses + $(tfs_stat_json cache misses) - m0))
		fi
		for i in $(seq 1 $SCAN_FILES); do
			rd "s$n"
			n=$((n + 1))
		done
	done
	[ "$(tfs_stat_json learner cycle_files)" -eq 0 ] || fail "$1: a cycle was learned"
	tfs_umount || fail "unmount"
	echo $((100 * hits / (hits + misses)))
}

q2=$(hot_hits 2q)
auto=$(hot_hits auto)
lru=$(hot_hits lru)
echo "hot-file hit rate under scans: 2q ${q2}%, auto ${auto}%, lru ${lru}% (tools/bench scan adds clock)"
[ "$q2" -ge 90 ] || fail "2q: ${q2}% of the hot file's reads hit, want >= 90%"
[ "$auto" -ge 90 ] || fail "auto: ${auto}%, want >= 90% (2q without a cycle)"
[ "$lru" -le 10 ] || fail "lru: ${lru}% where about 0 was expected"
echo "PASS: scan-resistant eviction"
