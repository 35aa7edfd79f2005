#!/bin/bash
# Security properties of a mount (docs/security.md says what was reviewed):
#
#   1. default_permissions is on by default and allow_other is off; with
#      -o allow_other, default_permissions stays on, and another user
#      (nobody) is held to the file modes. A SOURCE argument with commas
#      in it ("node7,allow_other,ro") is the mount's name, not options:
#      /proc/mounts shows it whole, allow_other stays off and the mount
#      writable. (Regression: it went into -o fsname= unescaped, so it
#      turned allow_other on behind the daemon's checks.)
#   2. A link planted in an nvme folder under the name of the slab or of the
#      identity file makes the mount fail and leaves the link's target as it
#      was. (Regression: both were opened through links, so whoever could
#      write the folder could make a root daemon truncate or overwrite any
#      file.) A slab that is not a regular file is refused too.
#   3. A relative logfile= and meta= name the files they meant even though
#      the daemon moves to / in the background. (Regression: the log went
#      to /FILE.) The log file has the mount's line and what the unmount
#      wrote back. (Regression: it had only the unmount's lines.)
#   4. An s3 endpoint URL with a user or password in it is refused without
#      being printed (the endpoint shows in logs, stats and the config), in
#      any scheme and any case of it, and so is one with a query or a
#      fragment. (Regression: HTTP:// and ftp:// endpoints were refused with
#      the whole URL, password included, in the message.)
#   5. A meta or nvme folder that another user (nobody) owns or can write,
#      or that holds links or another user's files under the store files'
#      names, is refused before anything is written, and the links' target
#      stays as it was. (Regression: LMDB opened lock.mdb and data.mdb
#      through links, so a root mount on such a folder overwrote the target.)
#      Folders of root, mode 755 or 700, still mount.
#   6. A tensorfs.slab or tensorfs.dev that another user made in advance, or
#      that is open to group or others, is refused, and a FIFO in place of
#      tensorfs.dev does not hang the start. The files a mount makes are
#      mode 600. (Regression: a 666 slab made by another user was used, so
#      that user could read root's data; a FIFO hung the mount.)
#   7. A write takes a file's privileges, as the kernel does on a disk:
#      set-user-ID and group-executable set-group-ID go when the writer is
#      not root (nobody), and stay for root; file capabilities go on any
#      write. Both through O_DIRECT, which the kernel hands to the daemon
#      whole, and through the page cache. An O_DIRECT descriptor open for
#      writing refuses a MAP_SHARED mmap (ENODEV); a read-only O_DIRECT one
#      and a plain one map. (Regression: O_DIRECT
#      writes went through the page cache's code, which asked the daemon for
#      security.capability before every write, under the file's lock.)

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

TFS_SOURCE='node7,allow_other,ro' tfs_mount
o=$(mount_opts)
src=$(awk -v m="$MNT" '$2 == m { print $1 }' /proc/mounts)
[ "$src" = 'node7,allow_other,ro' ] || fail "SOURCE with commas: /proc/mounts names the mount '$src'"
[[ $o == *,allow_other,* ]] && fail "a SOURCE with ',allow_other' turned it on: $o"
[[ $o == *,rw,* || $o == ,rw* ]] || fail "a SOURCE with ',ro' made the mount read-only: $o"
echo data >"$MNT/w" || fail "a SOURCE with ',ro': cannot write"
echo "   SOURCE '$src' is a name: options $o"
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
# The log tells the whole life: the mount, and what the unmount wrote back.
grep -q "info: mounted $MNT: dram 256 MiB" "$T/cwd/rel.log" ||
	fail "the log file has no line for the mount: $(cat "$T/cwd/rel.log")"
grep -Eq "stopped: all written back and synced \([0-9.]+ MiB dirty at the unmount, [0-9.]+ s\)" \
	"$T/cwd/rel.log" || fail "the log file does not say what the unmount wrote back: $(cat "$T/cwd/rel.log")"
echo "   log in $T/cwd/rel.log"

echo "4. an s3 endpoint with credentials in it is refused, and not printed"
mkdir -p "$T/n4"
pw="pw$RANDOM$RANDOM$RANDOM"
# endpoint_refused OPTS PATTERN: refused, saying PATTERN, with $pw nowhere.
endpoint_refused() {
	local rc=0
	AWS_ACCESS_KEY_ID=k AWS_SECRET_ACCESS_KEY=s timeout 30 "$TENSORFS" -f -o \
		"nvme=$T/n4,meta=$T/m4,dram=256M,threads=4,$1" "$MNT" >"$T/endpoint.out" 2>&1 || rc=$?
	is_mounted "$MNT" && fail "mounted with $1"
	[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "tensorfs exited $rc with $1"
	grep -qF "$pw" "$T/endpoint.out" && fail "the secret in the endpoint URL was printed: $1"
	grep -Eq "$2" "$T/endpoint.out" || fail "no reason (/$2/) given for $1: $(cat "$T/endpoint.out")"
	[ ! -e "$T/m4/data.mdb" ] || fail "$1 was refused after a metadata store was made"
	echo "   refused: $(tail -n 1 "$T/endpoint.out")"
}
endpoint_refused "remote=s3://b,endpoint=http://key:$pw@127.0.0.1:9" "user or password"
endpoint_refused "remote=s3://b,endpoint=HTTP://a:$pw@127.0.0.1:1/" "user or password"
endpoint_refused "remote=s3://b,endpoint=ftp://u:$pw@h/" "user or password"
endpoint_refused "remote=s3://b,endpoint=http://:$pw@127.0.0.1:9" "user or password"
endpoint_refused "remote=s3://b,endpoint=http://127.0.0.1:9/?X-Amz-Signature=$pw" "query"
endpoint_refused "remote=s3://b,endpoint=http://127.0.0.1:9/#$pw" "fragment"
endpoint_refused "remote=s3://b,endpoint=ftp://$pw.example/" "http:// or https://"
endpoint_refused "remote=s3://b,endpoint=http://u:p w$pw@127.0.0.1:9" "endpoint"
endpoint_refused "endpoint=http://u:$pw@127.0.0.1:9" "endpoint"

# refuse NAME PATTERN OPTS: the daemon refuses the -o options OPTS saying
# PATTERN (extended regex), mounts nothing, and leaves the decoy as it was.
echo "root's own" >"$T/decoy"
cp "$T/decoy" "$T/decoy.orig"
refuse() {
	local rc=0
	timeout 30 "$TENSORFS" -f -o "$3,dram=256M,threads=4" "$MNT" >"$T/refused.out" 2>&1 || rc=$?
	is_mounted "$MNT" && fail "$1: the mount went ahead"
	[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$1: tensorfs exited $rc"
	grep -Eq -- "$2" "$T/refused.out" || fail "$1: no message matching /$2/: $(cat "$T/refused.out")"
	cmp -s "$T/decoy" "$T/decoy.orig" || fail "$1: the decoy was changed"
	echo "   $1: refused ($(tail -n 1 "$T/refused.out"))"
}
# mounts NAME OPTS: the daemon mounts with OPTS, and unmounts cleanly.
mounts() {
	local opts="$2,dram=256M,threads=4"
	"$TENSORFS" -f -o "$opts" "$MNT" >>"$LOG" 2>&1 &
	TFS_PID=$!
	for _ in $(seq 1 200); do
		is_mounted "$MNT" && break
		kill -0 "$TFS_PID" 2>/dev/null || break
		sleep 0.05
	done
	is_mounted "$MNT" || fail "$1: did not mount (opts $opts)"
	echo data >"$MNT/f" || fail "$1: cannot write"
	tfs_umount || fail "$1: tensorfs exited $? at unmount"
	echo "   $1: mounts"
}

echo "5. meta and nvme folders that another user can change"
mkdir -p "$T/n5"
# The attacker's own folder, with links to root's file under LMDB's names.
mkdir "$T/meta-nobody"
ln -s "$T/decoy" "$T/meta-nobody/lock.mdb"
ln -s "$T/decoy" "$T/meta-nobody/data.mdb"
chown -h 65534:65534 "$T/meta-nobody" "$T/meta-nobody/lock.mdb" "$T/meta-nobody/data.mdb"
refuse "meta folder of another user" "meta folder $T/meta-nobody is owned by uid 65534" \
	"nvme=$T/n5,meta=$T/meta-nobody"
[ "$(ls -A "$T/meta-nobody" | sort | tr '\n' ' ')" = "data.mdb lock.mdb " ] ||
	fail "tensorfs wrote into a refused meta folder: $(ls -A "$T/meta-nobody")"
mkdir -m 777 "$T/meta-777"
ln -s "$T/decoy" "$T/meta-777/lock.mdb"
refuse "meta folder writable by others" "meta folder $T/meta-777 is writable by group or others" \
	"nvme=$T/n5,meta=$T/meta-777"
mkdir -m 770 "$T/meta-770"
refuse "meta folder writable by its group" "meta folder $T/meta-770 is writable by group" \
	"nvme=$T/n5,meta=$T/meta-770"
mkdir -m 700 "$T/meta-link"
ln -s "$T/decoy" "$T/meta-link/lock.mdb"
refuse "lock.mdb is a link" "meta folder $T/meta-link: lock.mdb is a symbolic link" \
	"nvme=$T/n5,meta=$T/meta-link"
rm "$T/meta-link/lock.mdb"
ln -s "$T/decoy" "$T/meta-link/lock"
refuse "lock is a link" "meta folder $T/meta-link: lock is a symbolic link" \
	"nvme=$T/n5,meta=$T/meta-link"
# The default meta folder is in the first nvme folder: that one is checked too.
mkdir -p "$T/nvme-nobody/meta"
ln -s "$T/decoy" "$T/nvme-nobody/meta/lock.mdb"
chown -hR 65534:65534 "$T/nvme-nobody"
refuse "nvme folder of another user, default meta" "nvme folder $T/nvme-nobody is owned by uid 65534" \
	"nvme=$T/nvme-nobody"
mkdir -m 775 "$T/nvme-775"
refuse "nvme folder writable by its group" "nvme folder $T/nvme-775 is writable by group" \
	"nvme=$T/nvme-775,meta=$T/m5"
mkdir -m 1777 "$T/nvme-1777"
refuse "sticky nvme folder writable by all" "nvme folder $T/nvme-1777 is writable by group or others" \
	"nvme=$T/nvme-1777,meta=$T/m5"
[ ! -e "$T/m5" ] || fail "a refused start made the meta folder $T/m5"
# Root's own folders, 755 and 700, mount; a store file of another user is then refused.
mkdir -m 755 "$T/n5-755" "$T/meta-755"
mounts "nvme and meta folders of root, mode 755" "nvme=$T/n5-755,meta=$T/meta-755"
mkdir -m 700 "$T/n5-700"
mounts "nvme folder of root, mode 700, default meta" "nvme=$T/n5-700"
for f in data.mdb lock.mdb lock; do
	[ "$(stat -c %a "$T/meta-755/$f")" = 600 ] || fail "$T/meta-755/$f is mode $(stat -c %a "$T/meta-755/$f"), not 600"
done
chown 65534 "$T/meta-755/data.mdb"
refuse "data.mdb of another user" "meta folder $T/meta-755: data.mdb is owned by uid 65534" \
	"nvme=$T/n5-755,meta=$T/meta-755"
chown 0 "$T/meta-755/data.mdb"
chmod 644 "$T/meta-755/lock.mdb"
refuse "lock.mdb readable by others" "meta folder $T/meta-755: lock.mdb is open to group or others" \
	"nvme=$T/n5-755,meta=$T/meta-755"
chmod 600 "$T/meta-755/lock.mdb"
mounts "the same store, its files 600 again" "nvme=$T/n5-755,meta=$T/meta-755"

echo "6. store files in an nvme folder that another user made, or can read"
mkdir -p "$T/n6"
: >"$T/n6/tensorfs.slab"
chmod 666 "$T/n6/tensorfs.slab"
chown 65534:65534 "$T/n6/tensorfs.slab"
refuse "a 666 tensorfs.slab of another user" "nvme folder $T/n6: tensorfs.slab is owned by uid 65534" \
	"nvme=$T/n6,meta=$T/m6"
[ ! -s "$T/n6/tensorfs.slab" ] || fail "tensorfs wrote into a slab file of another user"
[ ! -e "$T/n6/tensorfs.dev" ] || fail "a refused start left $T/n6/tensorfs.dev"
[ ! -e "$T/m6" ] || fail "a refused start made the meta folder $T/m6"
chown 0:0 "$T/n6/tensorfs.slab"
refuse "a 666 tensorfs.slab of root" "nvme folder $T/n6: tensorfs.slab is open to group or others" \
	"nvme=$T/n6,meta=$T/m6"
rm "$T/n6/tensorfs.slab"
echo "tensorfs-dev store=x index=0 kind=nvme" >"$T/n6/tensorfs.dev"
chown 65534:65534 "$T/n6/tensorfs.dev"
chmod 600 "$T/n6/tensorfs.dev"
refuse "tensorfs.dev of another user" "nvme folder $T/n6: tensorfs.dev is owned by uid 65534" \
	"nvme=$T/n6,meta=$T/m6"
rm "$T/n6/tensorfs.dev"
mkfifo "$T/n6/tensorfs.dev"
refuse "tensorfs.dev is a fifo" "nvme folder $T/n6: tensorfs.dev is a FIFO" "nvme=$T/n6,meta=$T/m6"
rm "$T/n6/tensorfs.dev"
mkdir "$T/n6/tensorfs.slab"
refuse "tensorfs.slab is a folder" "nvme folder $T/n6: tensorfs.slab is a folder" \
	"nvme=$T/n6,meta=$T/m6"
rmdir "$T/n6/tensorfs.slab"
[ -z "$(ls -A "$T/n6")" ] || fail "refused starts left $(ls -A "$T/n6") in $T/n6"
mounts "a fresh nvme folder" "nvme=$T/n6,meta=$T/m6"
for f in tensorfs.slab tensorfs.dev; do
	[ "$(stat -c '%a %u' "$T/n6/$f")" = "600 0" ] ||
		fail "$T/n6/$f is $(stat -c '%a %u' "$T/n6/$f") (mode, owner), not 600 0"
done
mounts "the same folder again" "nvme=$T/n6,meta=$T/m6"

echo "7. a write drops set-user-ID, set-group-ID and capabilities"
if command -v setpriv >/dev/null; then
	tfs_mount allow_other
	chmod 755 "$T" "$MNT"
	cat >"$T/wr.py" <<'PY'
import errno, mmap, os, sys
mode, path = sys.argv[1], sys.argv[2]
flags = os.O_WRONLY | (os.O_DIRECT if mode == "direct" else 0)
fd = os.open(path, flags)
buf = mmap.mmap(-1, 4096)  # aligned, for O_DIRECT
buf.write(b"w" * 4096)
if os.write(fd, buf) != 4096:
    sys.exit("short write")
os.close(fd)
PY
	# Caps NAME: a valid version-2 capability set (cap_net_raw, effective).
	caps() { python3 -c "import os, struct, sys
os.setxattr(sys.argv[1], 'security.capability', struct.pack('<5I', 0x02000001, 1 << 13, 0, 0, 0))" "$1"; }
	has_caps() { python3 -c "import os, sys
try:
    os.getxattr(sys.argv[1], 'security.capability')
except OSError:
    sys.exit(1)" "$1"; }
	for how in direct buffered; do
		f="$MNT/suid-$how"
		head -c 8192 /dev/urandom >"$f"
		chmod 6777 "$f"
		setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$T/wr.py" $how "$f" ||
			fail "nobody could not write a 6777 file ($how)"
		m=$(stat -c %a "$f")
		[ "$m" = 777 ] || fail "after nobody's $how write the mode is $m, not 777"
		chmod 6777 "$f"
		python3 "$T/wr.py" $how "$f" || fail "root could not write ($how)"
		m=$(stat -c %a "$f")
		[ "$m" = 6777 ] || fail "root's $how write changed the mode to $m"
		caps "$f" || fail "cannot set security.capability on $f"
		has_caps "$f" || fail "security.capability did not stick on $f"
		python3 "$T/wr.py" $how "$f" || fail "root could not write ($how)"
		has_caps "$f" && fail "security.capability survived root's $how write"
		# Set once more after a write: the first lookup's answer must not stay.
		caps "$f" || fail "cannot set security.capability again on $f"
		python3 "$T/wr.py" $how "$f" || fail "root could not write ($how)"
		has_caps "$f" && fail "security.capability set after a write survived the next ($how)"
		echo "   $how: nobody's write drops 6000, root's keeps it; any write drops capabilities"
	done
	python3 - "$MNT/suid-direct" <<'PY' || fail "mmap of O_DIRECT and plain descriptors"
import errno, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_DIRECT)
try:
    mmap.mmap(fd, 4096, mmap.MAP_SHARED)
    sys.exit("a MAP_SHARED mmap of an O_DIRECT descriptor went through")
except OSError as e:
    if e.errno != errno.ENODEV:
        raise
os.close(fd)
# A read-only O_DIRECT open keeps the page cache's path: it maps.
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
assert m[:4] == b"wwww", m[:4]
m.close()
os.close(fd)
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 4096, mmap.MAP_SHARED)
assert m[:4] == b"wwww", m[:4]
PY
	echo "   O_DIRECT for writing refuses MAP_SHARED (ENODEV); read-only O_DIRECT and plain map"
	tfs_umount || fail "tensorfs exited $? at unmount"
fi

echo "PASS: security checks"
exit 0
