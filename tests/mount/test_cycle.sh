#!/bin/bash
# Cycle-aware eviction: 16 files read in the same order 5 times over a DRAM
# tier a quarter of their size. With the learned cycle (cache_policy=auto)
# the hit rate of the last passes is within 5 points of C/N = 25%; LRU, on
# the same run, gets about 0. Reads are O_DIRECT so the kernel's page cache
# stays out of it, and readahead is off so that every hit is the policy's.
. "$(dirname "$0")/lib.sh"

FILES=16
BLOCKS=8 # MiB per file: 128 MiB in all, against 32 MiB of DRAM
PASSES=5

write_files() {
	local i
	for i in $(seq 1 $FILES); do
		dd if=/dev/urandom of="$MNT/f$i" bs=1M count=$BLOCKS oflag=direct conv=fsync \
			status=none || fail "writing f$i"
	done
}

read_pass() {
	local i
	for i in $(seq 1 $FILES); do
		dd if="$MNT/f$i" of=/dev/null bs=1M iflag=direct status=none || fail "reading f$i"
	done
}

# hit_rate POLICY: the hit rate of the last two passes, in percent.
hit_rate() {
	local h0 m0 h1 m1 p
	for p in $(seq 1 $((PASSES - 2))); do read_pass; done
	h0=$(tfs_stat_json cache hits) && m0=$(tfs_stat_json cache misses) || fail "stats"
	read_pass
	read_pass
	h1=$(tfs_stat_json cache hits) && m1=$(tfs_stat_json cache misses) || fail "stats"
	python3 -c "import sys; h,m=int(sys.argv[1]),int(sys.argv[2]); print(round(100*h/(h+m)))" \
		$((h1 - h0)) $((m1 - m0))
}

TFS_DRAM=32M TFS_THREADS=4 tfs_mount "readahead=0,cache_policy=auto"
write_files
tfs_umount || fail "unmount"

TFS_DRAM=32M TFS_THREADS=4 tfs_mount "readahead=0,cache_policy=auto"
auto=$(hit_rate)
cycle=$(tfs_stat_json learner cycle_files) || fail "stats"
[ "$cycle" -eq $FILES ] || fail "learned a cycle of $cycle files, want $FILES"
tfs_umount || fail "unmount"

TFS_DRAM=32M TFS_THREADS=4 tfs_mount "readahead=0,cache_policy=lru"
lru=$(hit_rate)
tfs_umount || fail "unmount"

echo "hit rate of the last $((2)) passes: auto ${auto}%, lru ${lru}% (C/N = 25%)"
[ "$auto" -ge 20 ] && [ "$auto" -le 30 ] || fail "auto: ${auto}% is not within 5 points of 25%"
[ "$lru" -le 5 ] || fail "lru: ${lru}% where about 0 was expected"
echo "PASS: cycle-aware eviction"
