#!/bin/bash
# Mount test of the activation offloader's traffic of files through the
# GPU socket, without a GPU (gpuchurn, linked with the CPU copy engine):
# 60 steps, each creating about 100 files in one folder, writing them
# through the arena, reading them back in reverse order, checking and
# unlinking them, while the next step's creates run (the names of every
# other step reused). Every create succeeds (the ENOENT seen once on a
# GPU is not here), every byte reads back, the folder ends empty, and the
# daemon logged no create whose folder, and no request whose inode, was
# missing from the store (fs/ops_names.c make_node, fs/inode.c fs_iget say so).
# data.mdb's size before and after is printed, not checked: the metadata
# space under create and unlink is the metadata tests' to bound.
# Then the CPU copy engine's rate: with TENSORFS_CPU_COPY_GBPS=0.005 a
# smaller churn takes at least its bytes over 5 MB/s (each direction is
# one engine; writes and reads overlap, so one direction's bytes bound
# it), and a malformed value fails the calls with a message naming it.

. "$(dirname "$0")/../mount/lib.sh"

: "${GPUCHURN:?GPUCHURN must name the gpuchurn test program}"
STEPS=${CHURN_STEPS:-60}
FILES=${CHURN_FILES:-100}

TFS_DRAM=256M TFS_THREADS=4 tfs_mount "cuda=on"
mkdir "$MNT/d" || fail "mkdir"
before=$(stat -c %s "$META/data.mdb")
before_du=$(du -k "$META/data.mdb" | cut -f1)
"$GPUCHURN" "$MNT/d" "$STEPS" "$FILES" 1024 || fail "creating, writing, reading and unlinking"
after=$(stat -c %s "$META/data.mdb")
after_du=$(du -k "$META/data.mdb" | cut -f1)
echo "data.mdb: $((before >> 10)) KiB before, $((after >> 10)) KiB after $((STEPS * FILES))" \
	"creates and unlinks (allocated: $before_du KiB, $after_du KiB)"
if grep "not in the store" "$LOG"; then
	fail "the daemon failed a create or a request on an inode with ENOENT"
fi
[ -z "$(ls -A "$MNT/d")" ] || fail "files left in the folder"

out=$(TENSORFS_CPU_COPY_GBPS=0.005 "$GPUCHURN" "$MNT/d" 2 8 512) || fail "churn at 0.005 GB/s: $out"
echo "$out" | head -n 1
echo "$out" | awk '/^bytes / { need = $2 / 5e6; if ($4 < need) { print "took " $4 " s, at least " need " s wanted"; exit 1 } }' ||
	fail "the copies went faster than TENSORFS_CPU_COPY_GBPS"
out=$(TENSORFS_CPU_COPY_GBPS=fast "$GPUCHURN" "$MNT/d" 1 1 64 2>&1) && fail "a malformed rate was taken"
case $out in *TENSORFS_CPU_COPY_GBPS=fast*) ;; *) fail "a malformed rate's message: $out" ;; esac
rm -f "$MNT"/d/*
tfs_umount || fail "unmount"
echo "PASS"
