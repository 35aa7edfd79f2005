#!/bin/bash
# Cycle-aware eviction and prefetch: 16 files read in the same order 5 times
# over a DRAM tier a quarter of their size. With the learned cycle
# (cache_policy=auto) the hit rate of the last passes is within 5 points of
# C/N = 25%; LRU, on the same run, gets about 0. Reads are O_DIRECT so the
# kernel's page cache stays out of it; readahead and prefetch are off there
# so that every hit is the policy's. Then, with prefetch on, reading file k
# of the known cycle makes the first blocks of file k+1 resident before it
# is read, and the rest arrive ahead of its reader. Last, the learner's
# streams: one per folder, also for files a listing named first.
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

TFS_DRAM=32M TFS_THREADS=4 tfs_mount "readahead=0,prefetch=off,cache_policy=auto"
auto=$(hit_rate)
cycle=$(tfs_stat_json learner cycle_files) || fail "stats"
[ "$cycle" -eq $FILES ] || fail "learned a cycle of $cycle files, want $FILES"
# A cycle that only reads writes nothing back: no slots are set aside for
# write-backs, and what stays is the DRAM tier less the flusher's clean
# reserve (4) and the prefetch window (4). With 16 set aside for a
# write-back depth, 8 of the 32 stayed, and the hit rate fell to 19% on a
# loaded machine.
kept=$(tfs_stat_json cache kept_bytes) || fail "stats"
echo "kept in DRAM of the read-only cycle: $((kept / 1048576)) MiB of 32"
[ "$kept" -ge $((24 * 1048576)) ] || fail "a read-only cycle kept $kept bytes, under 24 MiB"
tfs_umount || fail "unmount"

TFS_DRAM=32M TFS_THREADS=4 tfs_mount "readahead=0,prefetch=off,cache_policy=lru"
lru=$(hit_rate)
tfs_umount || fail "unmount"

echo "hit rate of the last $((2)) passes: auto ${auto}%, lru ${lru}% (C/N = 25%)"
[ "$auto" -ge 20 ] && [ "$auto" -le 30 ] || fail "auto: ${auto}% is not within 5 points of 25%"
[ "$lru" -le 5 ] || fail "lru: ${lru}% where about 0 was expected"

# Prefetch along the cycle: after reading f1, f2's blocks arrive without a read.
TFS_DRAM=32M TFS_THREADS=4 tfs_mount "readahead=0,cache_policy=auto"
for p in 1 2 3; do read_pass; done
[ "$(tfs_stat_json learner cycle_files)" -eq $FILES ] || fail "no cycle learned with prefetch on"
dd if="$MNT/f$FILES" of=/dev/null bs=1M iflag=direct status=none # the end of a pass
dd if="$MNT/f1" of=/dev/null bs=1M iflag=direct status=none || fail "reading f1"
# Bounded wait: the prefetcher holds DEPTH blocks loaded ahead and not yet
# read (issued - used - wasted), none in flight. f1 was read whole, so these
# are f2's first blocks that are not resident: the cycle is 4x the DRAM
# tier, so a share of every file stays (cache.kept_bytes), and f2's DRAM
# bytes alone do not tell whether the prefetch is done. The rest follow as
# f2 is read: every read takes a prefetched block and lets the prefetcher
# load one more.
DEPTH=4 # 1/64 of the slots, at least 4
ahead() {
	python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["prefetch"]; print(p["issued"]-p["used"]-p["wasted"])' \
		"$MNT/.tensorfs/stats"
}
# settled WHEN: wait (30 s at most: an ASan build on a loaded machine took
# over the 5 s this once allowed, and the reads after it then missed) until
# DEPTH blocks are loaded ahead and none is in flight; else fail.
settled() {
	local i
	for i in $(seq 1 600); do
		SETTLED_POLLS=$i
		[ "$(ahead)" -ge $DEPTH ] &&
			[ "$(tfs_stat_json tiers nvme0 inflight_prefetch)" -eq 0 ] && return
		sleep 0.05
	done
	fail "$1: $(ahead) blocks loaded ahead (want $DEPTH), $(tfs_stat_json tiers nvme0 inflight_prefetch) in flight, after 30 s"
}
settled "after f1"
echo "   the prefetcher settled after f1 in $SETTLED_POLLS polls of 50 ms"
h0=$(tfs_stat_json cache hits) && m0=$(tfs_stat_json cache misses) || fail "stats"
dd if="$MNT/f2" of=/dev/null bs=1M count=$DEPTH iflag=direct status=none || fail "reading f2"
h1=$(tfs_stat_json cache hits) && m1=$(tfs_stat_json cache misses) || fail "stats"
# Those reads made room: DEPTH more blocks are loaded, in the cycle's order,
# so f2's rest is resident or loaded. A wait, not a race with the reader:
# how soon the loads come is a benchmark's question (swapbench: late
# prefetches), and a loaded machine can delay them past a reader of hits.
settled "after f2's first $DEPTH MiB"
dd if="$MNT/f2" of=/dev/null bs=1M skip=$DEPTH iflag=direct status=none || fail "reading f2"
m2=$(tfs_stat_json cache misses)
used=$(tfs_stat_json prefetch used)
echo "reading f2 after f1: $((h1 - h0)) hits, $((m1 - m0)) misses in its first $DEPTH MiB," \
	"$((m2 - m1)) misses in the rest; prefetches used: $used"
# What the prefetcher and the cache did, for a failure to show.
pf_state() {
	python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("prefetch", json.dumps(s["prefetch"]), "cache kept_bytes", s["cache"].get("kept_bytes"))' \
		"$MNT/.tensorfs/stats"
}
[ $((h1 - h0)) -eq $DEPTH ] && [ $((m1 - m0)) -eq 0 ] ||
	fail "f2's first blocks were not prefetched while f1 was read ($(pf_state))"
[ $((m2 - m1)) -eq 0 ] || fail "the rest of f2 was not prefetched ahead of its reader ($(pf_state))"
[ "$used" -gt 0 ] || fail "no prefetched block was used"
tfs_umount || fail "unmount"

# Each folder's files are a stream of the learner's (an offloader's ranks
# swap to a folder each): a file's folder is known from the lookup or
# create that named it, or, when a listing (readdirplus) named it first
# and the kernel looks it up no more, from that listing. Two folders'
# files, read after a remount and `ls -l`: two streams (one, before the
# listing told the folder).
rm -rf "$NVME" "$META" && mkdir -p "$NVME"
tfs_mount
for d in a b; do
	mkdir "$MNT/$d" || fail "mkdir $d"
	dd if=/dev/zero of="$MNT/$d/f" bs=1M count=2 status=none || fail "writing $d/f"
done
tfs_umount || fail "unmount"
tfs_mount
ls -l "$MNT/a" "$MNT/b" >/dev/null || fail "ls -l"
cat "$MNT/a/f" "$MNT/b/f" >/dev/null || fail "reading a/f and b/f"
streams=$(tfs_stat_json learner streams) || fail "stats: no learner streams"
tfs_umount || fail "unmount"
[ "$streams" -eq 2 ] || fail "two folders' files, met through a listing: $streams learner streams, want 2"
echo "two folders, their files named by a listing: $streams learner streams"
echo "PASS: cycle-aware eviction and prefetch"
