#!/bin/bash
# fio with crc32c verification on tensorfs, the way DeepSpeed swaps tensors:
# libaio, O_DIRECT, 1 MiB requests, 8 in flight.
#
#   1. DRAM (128M) smaller than the data (512M): one file written, then read
#      back and verified, so most of it comes from the nvme tier; then four
#      jobs on four files of 128M, random order.
#   2. Unmount, remount, and verify the four files again with --verify_only,
#      reading every byte: the data survived the unmount. Then one byte of
#      one file is changed through the mount and --verify_only must fail,
#      which proves that the verification can fail.
#   3. DRAM (768M) larger than the data: write and verify 512M again.
#   4. The libaio engine (nvme_engine=libaio), DRAM (128M) smaller than the
#      data: pass 1's sequential file again, read back from nvme0, then
#      verified again after a remount, every byte from nvme0.
#
# Each fio run must exit 0, report no error for any job and have read back
# all the bytes it wrote.

. "$(dirname "$0")/lib.sh"

command -v fio >/dev/null || skip "fio is not installed"

FIO_DATA=512M
FIO_DATA_BYTES=$((512 * 1024 * 1024))

# run_fio NAME JSON-OUT FIO-ARGS... : fio in $T (its state files go there).
run_fio() {
	local name=$1 out=$2 rc=0
	shift 2
	(cd "$T" && fio --name="$name" --ioengine=libaio --direct=1 --bs=1M --iodepth=8 \
		--verify=crc32c --verify_fatal=1 --verify_state_save=0 \
		--output-format=json --output="$out" "$@") || rc=$?
	return $rc
}

# check_fio JSON WHAT EXPECTED-READ-BYTES : every job error-free, all read.
check_fio() {
	python3 - "$@" <<'PY' || fail "fio $2: results above"
import json, sys
path, what, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
jobs = json.load(open(path))["jobs"]
ok = True
total = 0
for j in jobs:
    total += j["read"]["io_bytes"]
    if j["error"] != 0:
        print(f"fio {what}: job {j['jobname']} error {j['error']}", file=sys.stderr)
        ok = False
if total != want:
    print(f"fio {what}: read back {total} bytes, expected {want}", file=sys.stderr)
    ok = False
print(f"   fio {what}: {len(jobs)} job(s), {total} bytes verified")
sys.exit(0 if ok else 1)
PY
}

check_errors() {
	[ "$(tfs_stat_json tiers nvme0 errors)" -eq 0 ] || fail "$1: nvme0 errors in stats"
	[ "$(tfs_stat_json tiers dram errors)" -eq 0 ] || fail "$1: dram errors in stats"
}

PAR_ARGS=(--directory="$MNT/par" --numjobs=4 --size=128M --rw=randwrite)

echo "== pass 1: dram=128M, $FIO_DATA of data"
TFS_DRAM=128M tfs_mount
run_fio seq "$T/seq1.json" --filename="$MNT/seq.dat" --size=$FIO_DATA --rw=write ||
	fail "fio sequential write+verify with dram=128M exited non-zero"
check_fio "$T/seq1.json" "write+verify, dram=128M" $FIO_DATA_BYTES
rb=$(tfs_stat_json tiers nvme0 read_bytes)
echo "   nvme0 read_bytes $rb"
[ "$rb" -gt 0 ] || fail "512M through 128M of DRAM, yet nothing was read from nvme0"
rm "$MNT/seq.dat" || fail "rm seq.dat"
mkdir "$MNT/par" || fail "mkdir par"
run_fio par "$T/par1.json" "${PAR_ARGS[@]}" ||
	fail "fio 4 jobs randwrite+verify with dram=128M exited non-zero"
check_fio "$T/par1.json" "4 jobs randwrite+verify, dram=128M" $FIO_DATA_BYTES
check_errors "pass 1"
tfs_umount || fail "tensorfs exited $? after unmount"

echo "== pass 2: remount, verify only"
TFS_DRAM=128M tfs_mount
run_fio par "$T/par2.json" "${PAR_ARGS[@]}" --verify_only ||
	fail "fio --verify_only after remount exited non-zero: data lost or changed by the remount"
check_fio "$T/par2.json" "verify-only after remount" $FIO_DATA_BYTES
check_errors "pass 2"
# One changed byte in the middle of a block of par.2.0 must be caught.
printf 'Z' | dd of="$MNT/par/par.2.0" bs=1 seek=$((5 * 1048576 + 777)) conv=notrunc,fsync \
	status=none || fail "dd into par.2.0"
if run_fio par "$T/par3.json" "${PAR_ARGS[@]}" --verify_only 2>"$T/fio-neg.err"; then
	fail "fio --verify_only passed on a file with a changed byte: verification cannot fail"
fi
grep -q "verify failed at file.*par.2.0" "$T/fio-neg.err" ||
	fail "fio did not report the changed byte in par.2.0: $(head -c 500 "$T/fio-neg.err")"
echo "   verify-only caught the changed byte in par.2.0"
rm -r "$MNT/par" || fail "rm par"
tfs_umount || fail "tensorfs exited $? after unmount"

echo "== pass 3: dram=768M, larger than the data"
TFS_DRAM=768M tfs_mount
run_fio seq "$T/seq3.json" --filename="$MNT/seq.dat" --size=$FIO_DATA --rw=write ||
	fail "fio sequential write+verify with dram=768M exited non-zero"
check_fio "$T/seq3.json" "write+verify, dram=768M" $FIO_DATA_BYTES
check_errors "pass 3"
tfs_umount || fail "tensorfs exited $? after unmount"

echo "== pass 4: nvme_engine=libaio, dram=128M"
TFS_DRAM=128M tfs_mount nvme_engine=libaio
[ "$(tfs_stat_json tiers nvme0 engine)" = libaio ] || fail "nvme0 engine is not libaio"
rb=$(tfs_stat_json tiers nvme0 read_bytes)
run_fio seq "$T/seq4.json" --filename="$MNT/seq.dat" --size=$FIO_DATA --rw=write ||
	fail "fio sequential write+verify on libaio exited non-zero"
check_fio "$T/seq4.json" "write+verify, libaio, dram=128M" $FIO_DATA_BYTES
rb=$(($(tfs_stat_json tiers nvme0 read_bytes) - rb))
echo "   nvme0 read_bytes $rb"
[ "$rb" -gt 0 ] || fail "512M through 128M of DRAM on libaio, yet nothing was read from nvme0"
check_errors "pass 4"
tfs_umount || fail "tensorfs exited $? after unmount"
TFS_DRAM=128M tfs_mount nvme_engine=libaio
run_fio seq "$T/seq5.json" --filename="$MNT/seq.dat" --size=$FIO_DATA --rw=write --verify_only ||
	fail "fio --verify_only on libaio after remount exited non-zero: data lost or changed"
check_fio "$T/seq5.json" "verify-only, libaio, after remount" $FIO_DATA_BYTES
[ "$(tfs_stat_json tiers nvme0 read_bytes)" -ge $FIO_DATA_BYTES ] ||
	fail "after remount, less than the file was read from nvme0"
check_errors "pass 4, after remount"
tfs_umount || fail "tensorfs exited $? after unmount"

echo "PASS: fio verify"
exit 0
