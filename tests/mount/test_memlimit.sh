#!/bin/bash
# Mount test: the daemon under a cgroup's memory limit (a container's;
# systemd's MemoryMax), which /proc/meminfo does not show. The DRAM tier is
# locked memory charged to the cgroup, so a tier larger than the limit was
# killed by the cgroup's OOM killer while it filled, at start, with nothing
# on stderr. In a memory cgroup of 512 MiB, the daemon started in the
# background, as a service starts it:
#   1. dram=1G: status 1, and stderr names the cgroup's limit and the most
#      dram= may be; no mount; the cgroup counts no OOM kill.
#   2. dram= that most: it mounts, and under 600 MiB written by 6 writers
#      with fsync, read back and compared, and 32 fio jobs of O_DIRECT
#      random 1 MiB reads and writes for 10 s, the cgroup counts no OOM
#      kill (memory.events or memory.oom_control: the kernel's count, not
#      the daemon's) and the daemon is alive and unmounts clean.
#   3. No dram=: the default tier is at most that most (its log), and it
#      mounts.
# Fails on a daemon that sizes its tier by the host's memory: step 1's
# daemon is killed (status 1 from the parent, nothing on stderr), and the
# default tier (a quarter of the host's MemAvailable) is killed too.

. "$(dirname "$0")/lib.sh"

command -v fio >/dev/null || skip "fio is not installed"
LIMIT_MB=512

. "$(dirname "$0")/lib_cgroup.sh"
cg_make memory memory.max memory.limit_in_bytes
echo $((LIMIT_MB << 20)) >"$CG/$LIMIT_FILE" || skip "cannot set $CG/$LIMIT_FILE"
if [ "$LIMIT_FILE" = memory.max ]; then
	oom_kills() { awk '$1 == "oom_kill" { print $2; f = 1 } END { if (!f) print 0 }' "$CG/memory.events"; }
else
	# oom_kill in memory.oom_control, kernels from 4.13 on
	oom_kills() {
		awk '$1 == "oom_kill" { print $2; f = 1 } END { if (!f) exit 1 }' "$CG/memory.oom_control" 2>/dev/null ||
			echo 0
	}
fi

DLOG="$T/daemon-bg.log"
# start_limited [OPTS]: the daemon in the background in the cgroup, with these -o options more
start_limited() {
	cg_start "nvme=$NVME,meta=$META,logfile=$DLOG${1:+,$1}"
}

# 1. dram= over the limit
start_limited dram=1G
[ $RC -ne 0 ] || fail "dram=1G under a ${LIMIT_MB} MiB limit: status 0"
is_mounted "$MNT" && fail "dram=1G under a ${LIMIT_MB} MiB limit: status $RC, but $MNT is mounted"
cg_empty 30 || fail "dram=1G: status $RC, and processes are left in the cgroup"
[ "$(oom_kills)" -eq 0 ] || fail "dram=1G: the cgroup's OOM killer ended the daemon ($(oom_kills) kills); stderr: $(cat "$T/stderr")"
grep -q "memory limit of this process's cgroup ($LIMIT_MB MiB, $CG/$LIMIT_FILE)" "$T/stderr" ||
	fail "dram=1G: stderr does not name the cgroup's limit: $(cat "$T/stderr")"
MOST=$(sed -n 's/.*dram= may be at most \([0-9]*\) MiB.*/\1/p' "$T/stderr")
[ -n "$MOST" ] && [ "$MOST" -gt 64 ] && [ "$MOST" -lt $LIMIT_MB ] ||
	fail "dram=1G: stderr does not say a usable most for dram=: $(cat "$T/stderr")"
echo "   dram=1G refused: $(cat "$T/stderr")"

# 2. dram= the most it said, under load
start_limited "dram=${MOST}M"
[ $RC -eq 0 ] || fail "dram=${MOST}M (the most the refusal named): status $RC: $(cat "$T/stderr")"
is_mounted "$MNT" || fail "dram=${MOST}M: status 0, but nothing is mounted"
PID=$(cg_procs | head -n 1)
for i in 1 2 3 4 5 6; do
	head -c $((100 << 20)) /dev/urandom >"$T/src$i"
done
pids=""
for i in 1 2 3 4 5 6; do
	timeout 120 dd if="$T/src$i" of="$MNT/f$i" bs=1M conv=fsync status=none &
	pids="$pids $!"
done
for p in $pids; do
	wait "$p" || fail "dram=${MOST}M: a writer failed (status $?)"
done
for i in 1 2 3 4 5 6; do
	timeout 60 cmp -s "$T/src$i" "$MNT/f$i" || fail "dram=${MOST}M: file $i reads back different"
done
timeout 120 fio --name=mix --directory="$MNT" --rw=randrw --bs=1M --size=64M --numjobs=32 \
	--direct=1 --ioengine=libaio --iodepth=4 --runtime=10 --time_based --group_reporting \
	--output="$T/fio.out" || fail "dram=${MOST}M: fio failed: $(tail -n 5 "$T/fio.out")"
[ "$(oom_kills)" -eq 0 ] || fail "dram=${MOST}M: the cgroup's OOM killer ended a process ($(oom_kills) kills)"
kill -0 "$PID" 2>/dev/null || fail "dram=${MOST}M: the daemon is gone"
RSS=$(awk '/^VmHWM/ { print int($2 / 1024) }' /proc/"$PID"/status)
echo "   dram=${MOST}M: 600 MiB and 10 s of fio with no OOM kill; the daemon's peak RSS $RSS MiB of the $LIMIT_MB MiB limit"
timeout 60 fusermount3 -u "$MNT" || fail "cannot unmount"
cg_empty 60 || fail "the daemon did not end within 60 s of its unmount"
grep -q "stopped: all written back" "$DLOG" || fail "the daemon did not stop clean: $(tail -n 3 "$DLOG")"

# 3. the default tier
: >"$DLOG"
start_limited
[ $RC -eq 0 ] || fail "no dram= under a ${LIMIT_MB} MiB limit: status $RC: $(cat "$T/stderr")"
DEF=$(sed -n 's/.*info: mounted .*: dram \([0-9]*\) MiB.*/\1/p' "$DLOG" "$T/stderr" | head -n 1)
[ -n "$DEF" ] && [ "$DEF" -le "$MOST" ] || fail "the default tier ($DEF MiB) is over the most ($MOST MiB)"
timeout 60 cmp -s "$T/src1" "$MNT/f1" || fail "the default tier: file 1 reads back different"
timeout 60 fusermount3 -u "$MNT" || fail "cannot unmount"
cg_empty 60 || fail "the daemon did not end within 60 s of its unmount"
[ "$(oom_kills)" -eq 0 ] || fail "the default tier: $(oom_kills) OOM kills"
echo "PASS: dram=1G refused, dram=${MOST}M served under load, the default tier is $DEF MiB, no OOM kill in a $LIMIT_MB MiB cgroup"
exit 0
