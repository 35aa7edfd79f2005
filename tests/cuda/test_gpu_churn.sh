#!/bin/bash
# Mount test of the activation offloader's traffic of files through the
# GPU socket, without a GPU (gpuchurn, linked with the CPU copy engine):
# 60 steps, each creating about 100 files in one folder, writing them
# through the arena, reading them back in reverse order, checking and
# unlinking them, while the next step's creates run (the names of every
# other step reused). Every create succeeds (the ENOENT seen once on a
# GPU is not here), every byte reads back, the folder ends empty, and the
# daemon logged no create whose folder, and no request whose inode, was
# missing from the store (fs/ops.c make_node, fs/inode.c fs_iget say so).
# data.mdb's size before and after is printed, not checked: the metadata
# space under create and unlink is the metadata tests' to bound.

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
tfs_umount || fail "unmount"
echo "PASS"
