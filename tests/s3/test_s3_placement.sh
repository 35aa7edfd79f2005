#!/bin/bash
# New blocks are placed in proportion to each tier's bandwidth cap: with
# nvme_bw=X and s3_bw=X/2, 512 MiB written and fsynced end up 2:1 on nvme0
# and s3 (tiers.<name>.used), within 10%. Then everything reads back after a
# remount, half of it from s3.

. "$(dirname "$0")/lib_s3.sh"

NVME_BW_MB=${NVME_BW_MB:-64}
TOTAL_MB=512
FILE_MB=64
export TFS_DRAM=128M TFS_THREADS=8

s3_start
OPTS="$(s3_mount_opts placement),nvme_bw=${NVME_BW_MB}M,s3_bw=$((NVME_BW_MB / 2))M"
tfs_mount "$OPTS"

mkdir -p "$T/orig"
START=$(date +%s%N)
for i in $(seq 1 $((TOTAL_MB / FILE_MB))); do
	head -c "${FILE_MB}M" /dev/urandom >"$T/orig/f$i"
	dd if="$T/orig/f$i" of="$MNT/f$i" bs=1M conv=fsync status=none || fail "write f$i"
done
MS=$((($(date +%s%N) - START) / 1000000))

NVME_USED=$(tfs_stat_json tiers nvme0 used)
S3_USED=$(tfs_stat_json tiers s3 used)
echo "   $TOTAL_MB MiB in $MS ms: nvme0 $((NVME_USED >> 20)) MiB" \
	"(measured $(($(tfs_stat_json tiers nvme0 bw_measured) >> 20)) MiB/s)," \
	"s3 $((S3_USED >> 20)) MiB (measured $(($(tfs_stat_json tiers s3 bw_measured) >> 20)) MiB/s)"
[ $((NVME_USED + S3_USED)) -eq $((TOTAL_MB << 20)) ] ||
	fail "the tiers hold $(((NVME_USED + S3_USED) >> 20)) MiB, not $TOTAL_MB MiB"
[ "$S3_USED" -gt 0 ] || fail "nothing went to s3"
python3 -c "import sys; r = $NVME_USED / $S3_USED; print('   nvme0:s3 = %.3f' % r); sys.exit(0 if 1.8 <= r <= 2.2 else 1)" ||
	fail "placement is not 2:1 within 10%"

tfs_umount || fail "tensorfs exited $? after unmount"
tfs_mount "$OPTS"
for i in $(seq 1 $((TOTAL_MB / FILE_MB))); do
	cmp -s "$T/orig/f$i" "$MNT/f$i" || fail "f$i differs after a remount"
done
[ "$(tfs_stat_json tiers s3 read_bytes)" -eq "$S3_USED" ] ||
	fail "s3 read $(tfs_stat_json tiers s3 read_bytes) bytes back, it holds $S3_USED"
tfs_umount || fail "tensorfs exited $? after unmount"
s3_secret_leaks "$LOG"

echo "PASS: placement follows the caps (2:1 between nvme0 and s3)"
exit 0
