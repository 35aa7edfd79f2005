#!/bin/bash
# Security properties of a mount (docs/security.md says what was reviewed):
#
#   1. default_permissions is on by default and allow_other is off; with
#      -o allow_other, default_permissions stays on, and another user
#      (nobody) is held to the file modes.
#   2. A link planted in an nvme folder under the name of the slab or of the
#      identity file makes the mount fail and leaves the link's target as it
#      was. (Regression: both were opened through links, so whoever could
#      write the folder could make a root daemon truncate or overwrite any
#      file.) A slab that is not a regular file is refused too.
#   3. A relative logfile= and meta= name the files they meant even though
#      the daemon moves to / in the background. (Regression: the log went
#      to /FILE.)
#   4. An s3 endpoint URL with a user or password in it is refused without
#      being printed (the endpoint shows in logs, stats and the config).

. "$(dirname "$0")/lib.sh"

mount_opts() {
	awk -v m="$MNT" '$2 == m { print "," $4 "," }' /proc/mounts
}

echo "1. default_permissions and allow_other"
tfs_mount
o=$(mount_opts)
[[ $o == *,default_permissions,* ]] || fail "default_permissions is not on by default: $o"
[[ $o == *,allow_other,* ]] && fail "allow_other is on without being asked for: $o"
tfs_umount || fail "tensorfs exited $? at unmount"

tfs_mount allow_other
o=$(mount_opts)
[[ $o == *,allow_other,* ]] || fail "-o allow_other did not reach the mount: $o"
[[ $o == *,default_permissions,* ]] || fail "allow_other dropped default_permissions: $o"
if command -v setpriv >/dev/null; then
	chmod 755 "$T" "$MNT"
	echo private >"$MNT/private" && chmod 600 "$MNT/private"
	echo public >"$MNT/public" && chmod 644 "$MNT/public"
	nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
	[ "$(nobody cat "$MNT/public")" = public ] || fail "nobody cannot read a 644 file"
	nobody cat "$MNT/private" >/dev/null 2>&1 && fail "nobody read a 600 file of root's"
	nobody sh -c "echo x >>'$MNT/public'" 2>/dev/null && fail "nobody wrote a 644 file of root's"
	nobody sh -c "echo x >'$MNT/new'" 2>/dev/null && fail "nobody created a file in a 755 folder of root's"
	echo "   nobody is held to the file modes"
fi
tfs_umount || fail "tensorfs exited $? at unmount"

echo "2. links planted in an nvme folder"
echo "precious contents" >"$T/victim"
cp "$T/victim" "$T/victim.orig"
# refused NAME: the daemon must refuse the folder $T/evil; the victim stays.
refused() {
	local rc=0
	timeout 30 "$TENSORFS" -f -o "nvme=$T/evil,meta=$T/evil-meta,dram=256M,threads=4" \
		"$MNT" >"$T/refused.out" 2>&1 || rc=$?
	is_mounted "$MNT" && fail "$1: the mount went ahead"
	[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$1: tensorfs exited $rc"
	cmp -s "$T/victim" "$T/victim.orig" || fail "$1: the link's target was changed"
	echo "   $1: refused ($(tail -n 1 "$T/refused.out"))"
	rm -rf "$T/evil" "$T/evil-meta"
}
mkdir "$T/evil"
ln -s "$T/victim" "$T/evil/tensorfs.slab"
refused "tensorfs.slab -> victim"
mkdir "$T/evil"
ln -s "$T/victim" "$T/evil/tensorfs.dev.target"
ln -s "$T/evil/nowhere" "$T/evil/tensorfs.dev"
refused "tensorfs.dev -> a file that does not exist yet"
[ -e "$T/evil/nowhere" ] && fail "the daemon created the target of a dangling tensorfs.dev link"
mkdir "$T/evil"
mkfifo "$T/evil/tensorfs.slab"
refused "tensorfs.slab is a fifo"

echo "3. relative logfile= and meta= in the background"
mkdir -p "$T/cwd/nvme"
(cd "$T/cwd" && "$TENSORFS" -o "nvme=nvme,meta=rel-meta,dram=256M,threads=4,logfile=rel.log" \
	"$MNT") >>"$LOG" 2>&1 || fail "tensorfs (in the background) failed to start"
is_mounted "$MNT" || fail "no mount after the background start"
TFS_PID=$(head -n 1 "$T/cwd/rel-meta/lock" 2>/dev/null)
[ -n "$TFS_PID" ] || fail "no metadata store in $T/cwd/rel-meta"
grep -qF "$T/cwd/rel-meta" "$MNT/.tensorfs/config" ||
	fail "the configuration does not name the meta folder by its absolute path"
fusermount3 -u "$MNT" || fail "fusermount3 -u failed"
for _ in $(seq 1 200); do
	kill -0 "$TFS_PID" 2>/dev/null || break
	sleep 0.1
done
kill -0 "$TFS_PID" 2>/dev/null && fail "the background daemon did not exit after the unmount"
TFS_PID=""
grep -q "unmounted" "$T/cwd/rel.log" 2>/dev/null ||
	fail "the log of a background daemon is not in $T/cwd/rel.log (relative to where it started)"
echo "   log in $T/cwd/rel.log"

echo "4. an s3 endpoint with credentials in it is refused, and not printed"
mkdir -p "$T/n4"
pw="pw$RANDOM$RANDOM$RANDOM"
rc=0
AWS_ACCESS_KEY_ID=k AWS_SECRET_ACCESS_KEY=s timeout 30 "$TENSORFS" -f -o \
	"nvme=$T/n4,meta=$T/m4,dram=256M,threads=4,remote=s3://b,endpoint=http://key:$pw@127.0.0.1:9" \
	"$MNT" >"$T/endpoint.out" 2>&1 || rc=$?
is_mounted "$MNT" && fail "mounted with credentials in the endpoint URL"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "tensorfs exited $rc with credentials in the endpoint URL"
grep -qF "$pw" "$T/endpoint.out" && fail "the password of the endpoint URL was printed"
grep -q "user or password" "$T/endpoint.out" || fail "no reason given: $(cat "$T/endpoint.out")"
echo "   refused: $(tail -n 1 "$T/endpoint.out")"

echo "PASS: security checks"
exit 0
