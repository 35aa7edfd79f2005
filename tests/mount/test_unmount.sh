#!/bin/bash
# An unmount that waits, and no mount over a mount.
#
# fusermount3 -u returns while the daemon still writes back what is dirty
# in DRAM (it must: nothing acknowledged may be lost), and the daemon holds
# its store until it is done. With 320 MiB dirty (dram= holds it all,
# dirty_expire_ms=0, dedup=off) and a device capped at nvme_bw=50M,
# write-back takes at least 6 s after the unmount; then:
#
#   1. A new mount of the same store right after the unmount waits for
#      that daemon (and says so), mounts once it has exited 0, and reads
#      back every byte (it was refused: "in use by another tensorfs").
#   2. tfsctl fsck right after an unmount waits too, and finds the store
#      clean (it said "unmount it first" of an unmounted store).
#   3. tfsctl unmount returns only once the daemon has exited 0, its lock
#      file says it stopped cleanly, and every block is in the slab file.
#      While it waits, a start of the store with lock_wait=1 is refused,
#      naming the daemon that writes back, within the bound.
#   4. tfsctl unmount of a daemon killed during its write-back exits 1,
#      saying so; a mount whose daemon was killed (ENOTCONN) is refused by
#      a new mount with what to do, and detached by tfsctl unmount.
#   5. No tensorfs over a live tensorfs: on its mount point (empty as it
#      looks), on a folder inside it, with nvme= or meta= inside it, or with
#      the same store on another mount point: each refused at once, rc != 0,
#      naming the mount, its meta folder and pid; the first mount still works.
#      Nor a meta folder under the new mount's own mount point. tfsctl
#      unmount of a busy mount fails, saying so, and leaves it working.
#
# Each part uses a store of its own. Bounds: each refusal within 30 s, each
# wait for a daemon within 300 s. UNMOUNT_TEST_MB sets the size (320);
# UNMOUNT_TEST_PARTS the parts to run (default "1 2 3 4 5").

. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
TFSCTL=$(readlink -f "$TFSCTL") # part 5 runs it from inside the mount
command -v python3 >/dev/null || skip "python3 not found"

MB=${UNMOUNT_TEST_MB:-320}
export TFS_DRAM=$((MB + 160))M TFS_THREADS=8
SLOW="dedup=off,dirty_expire_ms=0,nvme_bw=50M"
EXTRA_PIDS=() # daemons outside TFS_PID: stopped by the cleanup
EXTRA_MNTS=()

tfs_extra_cleanup() {
	local p m
	for m in "${EXTRA_MNTS[@]}"; do
		is_mounted "$m" && { fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m"; }
	done
	for p in "${EXTRA_PIDS[@]}"; do
		alive "$p" && kill -9 "$p" 2>/dev/null
	done
	true
}

head -c "${MB}M" /dev/urandom >"$T/src" || fail "cannot make the test data"
mkdir -p "$T/mnt2" || fail "mkdir"

# fresh_store N: the store of part N, the last part's removed.
fresh_store() {
	rm -rf "$NVME" "$META"
	NVME="$T/nvme-part$1"
	META="$T/meta-part$1"
	mkdir -p "$NVME" || fail "mkdir $NVME"
}

# write_dirty NAME: $MB MiB of $T/src into the mount, all of it dirty in DRAM.
write_dirty() {
	cp "$T/src" "$MNT/$1" || fail "writing $MNT/$1"
}

# unmount_racing: fusermount3 -u, and the daemon, still writing back, in OLD.
unmount_racing() {
	OLD=$TFS_PID
	TFS_PID=""
	EXTRA_PIDS+=("$OLD")
	fusermount3 -u "$MNT" || fail "fusermount3 -u $MNT failed"
	alive "$OLD" || fail "the daemon wrote back $MB MiB at nvme_bw= within fusermount3 -u:" \
		"the test shows nothing"
}

# gone_within SECS: $MNT is no longer mounted within SECS.
gone_within() {
	local i
	for ((i = 0; i < $1 * 10; i++)); do
		is_mounted "$MNT" || return 0
		sleep 0.1
	done
	return 1
}

# refused NAME MOUNTPOINT OPTS WORD...: a foreground start must end within
# 30 s, rc != 0, its message holding each WORD; a start that mounts fails.
refused() {
	local name=$1 mp=$2 opts=$3 rc
	shift 3
	"$TENSORFS" -f -o "$opts" "$mp" >"$T/refused.out" 2>&1 &
	local p=$!
	waitfor "$p" 30
	rc=$?
	if [ $rc -eq 124 ]; then
		EXTRA_PIDS+=("$p")
		EXTRA_MNTS+=("$mp")
		fail "$name: tensorfs mounted (or hung) instead of refusing: $(cat "$T/refused.out")"
	fi
	[ $rc -ne 0 ] || fail "$name: tensorfs exited 0: $(cat "$T/refused.out")"
	for w in "$@"; do
		grep -qF -- "$w" "$T/refused.out" ||
			fail "$name: the message does not name '$w': $(cat "$T/refused.out")"
	done
	echo "   $name: $(tail -n 1 "$T/refused.out")"
}

part1() {
	echo "1. fusermount3 -u with $MB MiB dirty, then a new mount of the same store"
	tfs_mount "$SLOW"
	write_dirty f1
	unmount_racing
	# the new daemon's device is not capped: the cap is on the old one's
	# write-back, and the read-back below needs none
	TFS_MOUNT_S=300 tfs_mount "dedup=off,dirty_expire_ms=0"
	alive "$OLD" && fail "the new mount is live while pid $OLD still holds the store"
	wait "$OLD" || fail "the unmounted daemon exited $?"
	grep -q "waiting for tensorfs pid $OLD to finish writing back" "$LOG" ||
		fail "the new mount did not say that it waited for pid $OLD"
	cmp "$T/src" "$MNT/f1" || fail "f1 reads back wrong after the remount"
	echo "   mounted after pid $OLD exited, every byte read back"
	tfs_umount || fail "the daemon exited $? at unmount"
}

part2() {
	echo "2. tfsctl fsck right after fusermount3 -u"
	tfs_mount "$SLOW"
	write_dirty f2
	unmount_racing
	within 300 "$TFSCTL" fsck "$META" >"$T/fsck.out" 2>"$T/fsck.err"
	rc=$?
	[ $rc -eq 0 ] || fail "tfsctl fsck exited $rc: $(cat "$T/fsck.out" "$T/fsck.err")"
	grep -q "fsck: clean" "$T/fsck.out" || fail "fsck is not clean: $(cat "$T/fsck.out")"
	grep -q "waiting for tensorfs pid $OLD" "$T/fsck.err" ||
		fail "fsck did not say that it waited: $(cat "$T/fsck.err")"
	alive "$OLD" && fail "fsck checked the store while pid $OLD held it"
	wait "$OLD" || fail "the unmounted daemon exited $?"
	echo "   $(tail -n 1 "$T/fsck.out") after waiting for pid $OLD"
}

part3() {
	echo "3. tfsctl unmount with $MB MiB dirty"
	tfs_mount "$SLOW"
	write_dirty f3
	P=$TFS_PID
	"$TFSCTL" unmount "$MNT" >"$T/unmount.out" 2>&1 &
	U=$!
	gone_within 30 || fail "tfsctl unmount did not unmount within 30 s: $(cat "$T/unmount.out")"
	alive "$P" || fail "the daemon wrote back $MB MiB at nvme_bw= at once: the test shows nothing"
	refused "lock_wait=1 while pid $P writes back" "$T/mnt2" \
		"nvme=$NVME,meta=$META,dram=$TFS_DRAM,threads=8,lock_wait=1" "pid $P" "writing back"
	waitfor "$U" 300
	rc=$?
	[ $rc -eq 0 ] || fail "tfsctl unmount exited $rc: $(cat "$T/unmount.out")"
	alive "$P" && fail "tfsctl unmount returned while the daemon (pid $P) runs"
	[ -s "$META/lock" ] && fail "the lock file does not say the stop was clean: $(cat "$META/lock")"
	is_mounted "$MNT" && fail "$MNT is still mounted"
	wait "$P" || fail "the daemon exited $? after tfsctl unmount"
	TFS_PID=""
	# Every block of f3 in the slab file, at a block-aligned slot (dedup=off).
	python3 - "$T/src" "$NVME/tensorfs.slab" <<-'PY' || fail "the slab file lacks blocks of f3"
	import hashlib, sys
	bs = 1 << 20
	def blocks(path):
	    with open(path, "rb") as f:
	        while b := f.read(bs):
	            yield hashlib.blake2b(b, digest_size=16).digest()
	want = set(blocks(sys.argv[1]))
	found = want & set(blocks(sys.argv[2]))
	print(f"   {len(found)} of {len(want)} blocks of f3 in the slab file")
	sys.exit(0 if found == want else 1)
	PY
	tfs_mount
	cmp "$T/src" "$MNT/f3" || fail "f3 reads back wrong"
	tfs_umount || fail "the daemon exited $? at unmount"
}

part4() {
	echo "4. tfsctl unmount of a daemon killed while it writes back; a dead mount"
	tfs_mount "dedup=off,dirty_expire_ms=0,nvme_bw=20M"
	head -c 200M "$T/src" >"$MNT/f4" || fail "writing f4"
	P=$TFS_PID
	"$TFSCTL" unmount "$MNT" >"$T/unmount.out" 2>&1 &
	U=$!
	gone_within 30 || fail "tfsctl unmount did not unmount within 30 s: $(cat "$T/unmount.out")"
	alive "$P" || fail "the daemon wrote back 200 MiB at 20 MB/s at once"
	kill -9 "$P"
	waitfor "$U" 30
	rc=$?
	[ $rc -eq 1 ] || fail "tfsctl unmount of a killed daemon exited $rc: $(cat "$T/unmount.out")"
	grep -q "ended before it had written back" "$T/unmount.out" ||
		fail "tfsctl unmount did not say the daemon was killed: $(cat "$T/unmount.out")"
	echo "   $(tail -n 1 "$T/unmount.out")"
	wait "$P" 2>/dev/null
	TFS_PID=""
	tfs_mount
	P=$TFS_PID
	kill -9 "$P"
	wait "$P" 2>/dev/null
	TFS_PID=""
	refused "a mount on a dead mount" "$MNT" "nvme=$NVME,meta=$META,dram=$TFS_DRAM" \
		"fusermount3 -u"
	within 30 "$TFSCTL" unmount "$MNT" >"$T/unmount.out" 2>&1
	rc=$?
	[ $rc -eq 1 ] || fail "tfsctl unmount of a dead mount exited $rc: $(cat "$T/unmount.out")"
	is_mounted "$MNT" && fail "tfsctl unmount left the dead mount: $(cat "$T/unmount.out")"
	echo "   $(tail -n 1 "$T/unmount.out")"
}

part5() {
	echo "5. no tensorfs over a live tensorfs"
	TFS_DRAM=256M tfs_mount
	mkdir -p "$T/nvme1" || fail "mkdir"
	OTHER="nvme=$T/nvme1,meta=$T/meta1,dram=256M,threads=8"
	refused "on the mount point, empty" "$MNT" "$OTHER" "$MNT" "$META" "pid $TFS_PID"
	mkdir -p "$MNT/sub" "$MNT/nv" || fail "mkdir in $MNT"
	refused "on a folder in the mount" "$MNT/sub" "$OTHER" "$MNT" "$META"
	refused "nvme= in the mount" "$T/mnt2" "nvme=$MNT/nv,meta=$T/meta1,dram=256M" "$MNT" "$META"
	refused "meta= in the mount" "$T/mnt2" "nvme=$T/nvme1,meta=$MNT/nv/m,dram=256M" "$MNT" "$META"
	refused "the same store elsewhere" "$T/mnt2" "nvme=$NVME,meta=$META,dram=256M" \
		"$MNT" "pid $TFS_PID"
	refused "meta= under its own mount point" "$T/mnt2" "nvme=$T/nvme1,meta=$T/mnt2/m,dram=256M" \
		"$T/mnt2" "hide"
	[ -e "$T/meta1" ] && fail "a refused start made $T/meta1"
	[ -e "$T/mnt2/m" ] && fail "a refused start made $T/mnt2/m"
	{ head -c 4M "$T/src" >"$MNT/after" && cmp <(head -c 4M "$T/src") "$MNT/after"; } ||
		fail "the first mount does not work after the refusals"
	tfs_stat_json cache >/dev/null || fail "the first mount's stats do not read"
	# A busy mount: tfsctl unmount fails, saying so, and leaves it working.
	(cd "$MNT" && exec "$TFSCTL" unmount "$MNT") >"$T/unmount.out" 2>&1
	rc=$?
	[ $rc -eq 1 ] || fail "tfsctl unmount of a busy mount exited $rc: $(cat "$T/unmount.out")"
	grep -q "busy" "$T/unmount.out" || fail "tfsctl unmount did not say busy: $(cat "$T/unmount.out")"
	{ is_mounted "$MNT" && cmp <(head -c 4M "$T/src") "$MNT/after"; } ||
		fail "the busy mount does not work after tfsctl unmount refused"
	echo "   busy: $(tail -n 1 "$T/unmount.out")"
	tfs_umount || fail "the daemon exited $? at the last unmount"
}

for n in ${UNMOUNT_TEST_PARTS:-1 2 3 4 5}; do
	fresh_store "$n"
	"part$n"
done
echo "PASS"
