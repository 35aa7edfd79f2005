#!/bin/bash
# fsx over the remote tiers: random writes, reads, truncates, fallocates,
# hole punches, copies and renames, every read compared with fsx's model,
# with remounts that make every block come back from its tier. Five
# filesystems, each fresh:
#   1. s3 as the only persistent tier (nvme=none);
#   2. a pfs folder as the only persistent tier;
#   3. nvme and s3 together;
#   4. nvme and a pfs folder together;
#   5. nvme, s3 and a pfs folder together, with equal caps so that each
#      takes a share of the blocks; fsx's few surviving blocks may all lie
#      on one or two of them, so a 48 MiB file, spread over all three, is
#      written and read back after a remount too.
#
# After each remount fsx compares every file whole, so every block is read
# back from its tier. Seeds come from FSX_SEED, or are drawn here, and are
# printed; FSX_OPS sets the length of each run (default 3000).

. "$(dirname "$0")/lib_s3.sh"
FSX_OPS=${FSX_OPS:-3000}
. "$(dirname "$0")/../mount/lib_fsx.sh"

s3_test_cleanup() { fsx_cleanup; }

# run_fsx NAME SEED : fsx_run with small files, as remote tiers are slower.
run_fsx() {
	fsx_run "$1" "$2" --check-every 1000 --files 3 --max-size 8M
}

# check_tier NAME: since the last remount, blocks came back from tier NAME,
# and no tier counted an error.
check_tier() {
	local tier=$1 rb t
	rb=$(tfs_stat_json tiers "$tier" read_bytes) || fail "no stats for tier $tier"
	echo "   $tier: $rb bytes read back since the last remount"
	[ "$rb" -gt 0 ] || fail "nothing was read back from $tier"
	for t in $(python3 -c 'import json,sys; print(*json.load(open(sys.argv[1]))["tiers"])' \
		"$MNT/.tensorfs/stats"); do
		[ "$(tfs_stat_json tiers "$t" errors)" -eq 0 ] || fail "errors on tier $t"
	done
	[ "$(tfs_stat_json tiers "$tier" state)" = up ] || fail "tier $tier is not up"
}

# fresh_fs NAME OPTIONS: a new filesystem (metadata, nvme folder) with OPTIONS.
fresh_fs() {
	# shellcheck disable=SC2034 # read by tfs_mount
	META="$T/meta-$1"
	NVME="$T/nvme-$1"
	mkdir -p "$NVME"
	MOUNT_OPTS=$2
	tfs_mount "$MOUNT_OPTS"
}

echo "fsx seeds: $SEED0 .. $((SEED0 + 4)), $FSX_OPS operations each"
export TFS_DRAM=96M TFS_THREADS=8
s3_start
mkdir -p "$T/pfs-only" "$T/pfs-nvme" "$T/pfs-all"

fresh_fs s3 "nvme=none,$(s3_mount_opts fsx-s3)"
run_fsx s3-only "$SEED0"
check_tier s3
tfs_umount || fail "tensorfs exited $? after unmount"

fresh_fs pfs "nvme=none,remote=$T/pfs-only"
run_fsx pfs-only "$((SEED0 + 1))"
check_tier pfs
tfs_umount || fail "tensorfs exited $? after unmount"

fresh_fs nvme-s3 "$(s3_mount_opts fsx-nvme-s3)"
run_fsx nvme-s3 "$((SEED0 + 2))"
check_tier s3
check_tier nvme0
tfs_umount || fail "tensorfs exited $? after unmount"

fresh_fs nvme-pfs "remote=$T/pfs-nvme"
run_fsx nvme-pfs "$((SEED0 + 3))"
check_tier pfs
check_tier nvme0
tfs_umount || fail "tensorfs exited $? after unmount"

fresh_fs all "$(s3_mount_opts fsx-all),remote=$T/pfs-all,nvme_bw=1G,s3_bw=1G,pfs_bw=1G"
run_fsx nvme-s3-pfs "$((SEED0 + 4))"
# fsx's few blocks may all sit on one or two tiers (its files die and shrink
# at random): a 48 MiB file, fsynced, spreads over all three, and comes back
# from each after a remount.
head -c 48M /dev/urandom >"$T/spread"
cp "$T/spread" "$MNT/spread" && sync "$MNT/spread" || fail "write spread"
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_mount "$MOUNT_OPTS"
cmp "$T/spread" "$MNT/spread" || fail "spread differs after a remount"
check_tier s3
check_tier pfs
check_tier nvme0
tfs_umount || fail "tensorfs exited $? after unmount"

s3_secret_leaks "$LOG"
echo "PASS: fsx on s3, pfs, nvme+s3, nvme+pfs and nvme+s3+pfs (seeds $SEED0 .. $((SEED0 + 4)))"
exit 0
