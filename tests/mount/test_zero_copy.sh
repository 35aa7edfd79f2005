#!/bin/bash
# Writes received into the DRAM arena (fs/loop.c): a write of one whole
# block (1 MiB at a multiple of 1 MiB) lands in a spare slot that becomes
# the block's slot, with no copy in the daemon; any other write is copied
# from that slot as before. The DRAM tier's zero_copy_write_bytes counts
# the first kind exactly, and every byte reads back right, from DRAM, from
# nvme0 and after a remount.
#
#   1. 256M of O_DIRECT 1 MiB writes (dram=128M): all 256M zero-copy.
#   2. The same file rewritten in 300K writes: none zero-copy.
#   3. 64M in its middle rewritten in 1 MiB writes: exactly 64M zero-copy.
#   4. With two threads, a writer rewrites a file of 4 blocks 200 times
#      while three readers read it (a block a reader holds is copied into,
#      not swapped): the readers see only the right block's bytes, of
#      either generation (a page may mix them, as a copy under way tears
#      it on any O_DIRECT file), and the file ends as the last generation.
#   5. Remount: every file is what was written.
#   6. SIGTERM, then SIGHUP, to the daemon (a background job ignores
#      SIGINT): it ends with status 0 and leaves nothing mounted (its
#      threads are woken out of their reads), and the data is there at the
#      next mount; fsck finds no error. Run under nohup, the daemon starts
#      with SIGHUP ignored and must stay up on it (then SIGTERM ends it).
. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"

MB=$((1 << 20))
TFS_DRAM=128M
tfs_mount

zc() { tfs_stat_json tiers dram zero_copy_write_bytes; }

head -c $((256 * MB)) /dev/urandom >"$T/a.src" || fail "no random data"
head -c $((256 * MB)) /dev/urandom >"$T/b.src" || fail "no random data"

echo "1. 256M in O_DIRECT 1 MiB writes"
z0=$(zc)
dd if="$T/a.src" of="$MNT/a" bs=1M oflag=direct status=none || fail "part 1: dd failed"
z1=$(zc)
[ $((z1 - z0)) -eq $((256 * MB)) ] || fail "part 1: $((z1 - z0)) bytes zero-copy, want $((256 * MB))"
cmp "$T/a.src" "$MNT/a" || fail "part 1: a reads back wrong"

echo "2. the same file in 300K O_DIRECT writes"
z0=$(zc)
dd if="$T/b.src" of="$MNT/a" bs=300K oflag=direct conv=notrunc status=none ||
	fail "part 2: dd failed"
z1=$(zc)
[ "$z1" -eq "$z0" ] || fail "part 2: $((z1 - z0)) bytes zero-copy, want none"
cmp "$T/b.src" "$MNT/a" || fail "part 2: a reads back wrong"
cp "$T/b.src" "$T/a.want"

echo "3. 64M in the middle in 1 MiB writes"
z0=$(zc)
dd if="$T/a.src" of="$MNT/a" bs=1M skip=100 seek=100 count=64 oflag=direct conv=notrunc \
	status=none || fail "part 3: dd failed"
dd if="$T/a.src" of="$T/a.want" bs=1M skip=100 seek=100 count=64 conv=notrunc status=none
z1=$(zc)
[ $((z1 - z0)) -eq $((64 * MB)) ] || fail "part 3: $((z1 - z0)) bytes zero-copy, want $((64 * MB))"
echo 3 >/proc/sys/vm/drop_caches 2>/dev/null
cmp "$T/a.want" "$MNT/a" || fail "part 3: a reads back wrong"

echo "4. rewrites of a file while three readers read it, with two threads"
# Two threads: a slot swapped out from under a reader would be the other
# thread's spare, and take the next write's bytes within a request or two.
tfs_umount || fail "tensorfs exited $? at unmount"
TFS_THREADS=2 tfs_mount
z0=$(zc)
python3 - "$MNT/c" <<'PY' || fail "part 4: see above"
import mmap, os, struct, sys, threading

path, MB, NB, GENS, PAGE = sys.argv[1], 1 << 20, 4, 200, 4096

def make(gen, idx):
    # every 4 KiB page names its generation and block, and its own place
    return b"".join(struct.pack("<QQQ", gen, idx, p) * (PAGE // 24) + bytes(PAGE % 24)
                    for p in range(MB // PAGE))

# made ahead, so that the writer keeps the threads busy
blocks = {(gen, idx): make(gen, idx) for gen in (1, 2) for idx in range(NB)}

def block(gen, idx):
    return blocks[(2 - gen % 2, idx)]

done, errors, checked, zero = threading.Event(), [], [0], bytes(PAGE)

def writer():
    buf = mmap.mmap(-1, MB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    try:
        for gen in range(1, GENS + 1):
            for idx in range(NB):
                buf[:] = block(gen, idx)
                if os.pwrite(fd, buf, idx * MB) != MB:
                    errors.append(f"short write of block {idx}")
    finally:
        os.close(fd)
        done.set()

def reader(n):
    buf = mmap.mmap(-1, MB)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)  # made before the threads start
    try:
        while not done.is_set():
            for idx in range(NB):
                got = os.preadv(fd, [buf], idx * MB)
                if got == 0:
                    continue  # not written yet
                checked[0] += 1
                for p in range(0, got, PAGE):
                    page = buf[p:p + PAGE]
                    if page == zero or page == block(1, idx)[p:p + PAGE] or \
                            page == block(2, idx)[p:p + PAGE]:
                        continue  # zeros: not written yet
                    # Torn between the two generations (or zeros) by a copy
                    # under way (no atomicity, as on any O_DIRECT file): still
                    # every record of this block and page, of either one.
                    for gen, i, q in struct.iter_unpack("<QQQ", page[:PAGE - PAGE % 24]):
                        if gen == i == q == 0:
                            continue  # the block's first write under way
                        if i != idx or q != p // PAGE or gen not in (1, 2):
                            errors.append(f"reader {n}: block {idx} page {p // PAGE} holds "
                                          f"gen {gen} block {i} page {q}")
                            return
    finally:
        os.close(fd)

open(path, "wb").close()
ts = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(n,))
                                          for n in range(3)]
for t in ts:
    t.start()
for t in ts:
    t.join()
with open(path, "rb") as f:
    for idx in range(NB):
        if f.read(MB) != block(GENS, idx):
            errors.append(f"block {idx} is not the last generation")
            break
if checked[0] < 100:
    errors.append(f"the readers read only {checked[0]} blocks")
if errors:
    print("\n".join(errors[:5]), file=sys.stderr)
    sys.exit(1)
PY
[ "$(zc)" -gt "$z0" ] || fail "part 4: no write of part 4 was zero-copy"

echo "5. remount"
tfs_umount || fail "tensorfs exited $? at unmount"
tfs_mount
cmp "$T/a.want" "$MNT/a" || fail "part 5: a reads back wrong after a remount"
[ "$(tfs_stat_json tiers nvme0 read_bytes)" -gt 0 ] || fail "part 5: nothing read from nvme0"

echo "6. SIGTERM and SIGHUP end the daemon: exit 0, unmounted, data kept"
# Whether this shell was started with SIGHUP ignored (nohup): the daemon
# inherits that, and like any program keeps it so (libfuse installs no
# handler over an ignored signal).
hup_ignored() {
	local mask
	mask=$(awk '/^SigIgn:/ { print $2 }' /proc/$$/status)
	(((16#$mask) & 1))
}
for sig in TERM HUP; do
	kill -"$sig" "$TFS_PID"
	if [ "$sig" = HUP ] && hup_ignored; then
		sleep 1
		kill -0 "$TFS_PID" 2>/dev/null && is_mounted "$MNT" ||
			fail "part 6: tensorfs ended on SIGHUP, which it was started with ignored (nohup)"
		echo "   SIGHUP is ignored here (nohup): the daemon stayed; SIGTERM ends it"
		kill -TERM "$TFS_PID"
	fi
	rc=0
	waitfor "$TFS_PID" 20 || rc=$?
	[ "$rc" -eq 0 ] || fail "part 6: tensorfs exited $rc on SIG$sig, want 0"
	TFS_PID=""
	! is_mounted "$MNT" || fail "part 6: still mounted after SIG$sig"
	tfs_mount
	cmp "$T/a.want" "$MNT/a" || fail "part 6: a reads back wrong after SIG$sig"
done
tfs_umount || fail "tensorfs exited $? at unmount"
"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1 || fail "fsck: $(cat "$T/fsck.out")"
grep -q '^fsck: clean$' "$T/fsck.out" || fail "fsck: $(cat "$T/fsck.out")"

echo "PASS: zero-copy writes"
exit 0
