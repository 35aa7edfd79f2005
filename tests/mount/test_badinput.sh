#!/bin/bash
# Mount test: bad input is refused loudly and leaves nothing behind.
#
# Each bad command line runs twice, in the foreground (-f) and as a daemon.
# Both times tensorfs must exit non-zero, print a message on stderr that
# names the problem (an option name, a value or a path, matched outside the
# lines of --help, so that a usage dump alone does not pass), leave no mount
# on the mount point and no tensorfs process. A second daemon on a metadata
# folder in use is refused too, and the first mount stays healthy.
#
# Regressions of issue 12: dram= above 90% of the host's memory was taken
# (and mlocked); a config= that is a folder was read as empty, one that is
# /dev/zero or a FIFO hung the start, one of another user was used; a first
# start refused by nvme_cap= left tensorfs.dev behind, after which every
# start said the folder belonged to another store.

. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null 2>&1 || skip "python3 not found"

FAILS=0
CASE_MNTS=()
RO="$T/ro-nvme"

bad() {
	echo "FAIL: $*" >&2
	FAILS=$((FAILS + 1))
}

# our_daemons: pids of tensorfs processes started by this test (their
# command line names this test's work folder), except the healthy mount.
our_daemons() {
	tfs_daemons "${TFS_PID:-0}"
}

# reap_daemons: wait up to 5 s for stray daemons to exit, then stop them.
# Returns non-zero if there were any.
reap_daemons() {
	local i p pids
	for i in $(seq 1 100); do
		pids=$(our_daemons)
		[ -z "$pids" ] && return 0
		sleep 0.05
	done
	for p in $pids; do kill "$p" 2>/dev/null; done
	for i in $(seq 1 100); do
		[ -z "$(our_daemons)" ] && return 1
		sleep 0.05
	done
	for p in $(our_daemons); do kill -9 "$p" 2>/dev/null; done
	return 1
}

tfs_extra_cleanup() {
	local m
	for m in "${CASE_MNTS[@]}"; do
		is_mounted "$m" && { fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m"; }
	done
	reap_daemons
	is_mounted "$RO" && umount "$RO"
	true
}

# reject NAME PATTERN MOUNTPOINT ARG... : run tensorfs ARG... in both modes
# and expect a refusal whose stderr matches PATTERN (extended regex, any
# case) on a line that --help does not print.
reject() {
	local name=$1 pat=$2 mp=$3 mode pid rc i
	shift 3
	CASE_MNTS+=("$mp")
	for mode in foreground daemon; do
		local err="$T/stderr"
		if [ "$mode" = foreground ]; then
			"$TENSORFS" -f "$@" >/dev/null 2>"$err" &
		else
			"$TENSORFS" "$@" >/dev/null 2>"$err" &
		fi
		pid=$!
		for i in $(seq 1 200); do
			kill -0 "$pid" 2>/dev/null || break
			[ "$mode" = foreground ] && is_mounted "$mp" && break
			sleep 0.05
		done
		if kill -0 "$pid" 2>/dev/null; then
			bad "$name ($mode): still running after 10 s, input accepted"
			is_mounted "$mp" && fusermount3 -u "$mp"
			kill "$pid" 2>/dev/null
			wait "$pid" 2>/dev/null
			reap_daemons
			continue
		fi
		wait "$pid"
		rc=$?
		[ "$rc" -ne 0 ] || bad "$name ($mode): exit status 0"
		if ! grep -vxFf "$T/help" "$err" | grep -Eqi -- "$pat"; then
			bad "$name ($mode): stderr does not name the problem (/$pat/): $(head -c 300 "$err")"
		fi
		if is_mounted "$mp"; then
			bad "$name ($mode): left a mount on $mp"
			fusermount3 -u -z "$mp" 2>/dev/null || umount -l "$mp"
		fi
		reap_daemons || bad "$name ($mode): left a tensorfs process behind"
	done
}

# --help and --version.
"$TENSORFS" --help >"$T/help" 2>&1 || bad "--help: exit status $?"
for o in dram= nvme= block= meta= threads= config=; do
	grep -qF -- "$o" "$T/help" || bad "--help does not list $o"
done
grep -q "90%" "$T/help" || bad "--help does not state the bound on dram="
"$TENSORFS" --version >"$T/version" 2>&1 || bad "--version: exit status $?"
grep -Eq '[0-9]+\.[0-9]+' "$T/version" || bad "--version prints no version: $(head -c 200 "$T/version")"

# Option values. Each case has its own mount point and metadata folder.
n=0
next_case() {
	n=$((n + 1))
	CM="$T/m.$n"
	mkdir -p "$CM"
	OK_OPTS="nvme=$NVME,meta=$T/meta.$n,dram=256M"
}

next_case; reject "unknown option" 'frobnicate' "$CM" -o "$OK_OPTS,frobnicate=1" "$CM"
next_case; reject "dram=12Q" 'dram|12q' "$CM" -o "$OK_OPTS,dram=12Q" "$CM"
# A typo of one of ours gets the name it was probably meant to be; a second
# nvme folder after a comma, the separator; bits are not a size.
next_case; reject "queue_detph=8" "unknown option 'queue_detph': did you mean 'queue_depth'" "$CM" \
	-o "$OK_OPTS,queue_detph=8" "$CM"
next_case; reject "nvme=A,B" "'$T/nvme-b' is not an option: nvme folders are separated by ':'" "$CM" \
	-o "$OK_OPTS,nvme=$NVME,$T/nvme-b" "$CM"
next_case; reject "dram=1Gb" 'dram|1gb' "$CM" -o "$OK_OPTS,dram=1Gb" "$CM"
next_case; reject "dram= (empty)" 'dram' "$CM" -o "nvme=$NVME,meta=$T/meta.$n,dram=" "$CM"
next_case; reject "block=3K" 'block|3k' "$CM" -o "$OK_OPTS,block=3K" "$CM"
next_case; reject "block=1T" 'block|1t' "$CM" -o "$OK_OPTS,block=1T" "$CM"
next_case; reject "threads=0" 'thread' "$CM" -o "$OK_OPTS,threads=0" "$CM"
next_case; reject "nvme_engine=bogus" 'nvme_engine|bogus' "$CM" -o "$OK_OPTS,nvme_engine=bogus" "$CM"
# Twice the host's memory: mlocked, it would call in the OOM killer.
mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
next_case; reject "dram= twice the host's memory" "dram='$((mem_kb * 2))K'.*more than 90% of this host's memory" \
	"$CM" -o "$OK_OPTS,dram=$((mem_kb * 2))K" "$CM"
next_case; reject "dram= of the host's whole memory" "dram=.*more than 90%.*at most [0-9]+ MiB" \
	"$CM" -o "$OK_OPTS,dram=${mem_kb}K" "$CM"

# Folders.
next_case; reject "missing nvme folder" 'no-such-nvme' "$CM" \
	-o "nvme=$T/no-such-nvme,meta=$T/meta.$n,dram=256M" "$CM"
mkdir -p "$RO"
if mount -t tmpfs -o ro,size=1m,mode=0755 tmpfs "$RO" 2>/dev/null; then
	next_case; reject "read-only nvme folder" 'ro-nvme|read-only' "$CM" \
		-o "nvme=$RO,meta=$T/meta.$n,dram=256M" "$CM"
	umount "$RO"
else
	echo "note: cannot mount a read-only tmpfs here, read-only nvme case left out" >&2
fi
next_case; reject "missing mount point" 'no-such-mnt' "$T/no-such-mnt" \
	-o "$OK_OPTS" "$T/no-such-mnt"
next_case; : >"$T/file-mnt"
reject "mount point is a file" 'file-mnt|not a directory' "$T/file-mnt" -o "$OK_OPTS" "$T/file-mnt"
next_case; mkdir -p "$T/full-mnt" && echo x >"$T/full-mnt/x"
reject "mount point not empty" 'full-mnt|not empty' "$T/full-mnt" -o "$OK_OPTS" "$T/full-mnt"

# Config files.
next_case; reject "missing config file" 'no-such\.ini' "$CM" \
	-o "$OK_OPTS,config=$T/no-such.ini" "$CM"
printf '[tensorfs]\ndram = 64M\nthis line is not ini\n' >"$T/badline.ini"
next_case; reject "config file with a bad line" 'badline\.ini|line 3' "$CM" \
	-o "$OK_OPTS,config=$T/badline.ini" "$CM"
printf '[tensorfs]\nfrobnicate = 1\n' >"$T/badkey.ini"
next_case; reject "config file with an unknown key" 'frobnicate' "$CM" \
	-o "$OK_OPTS,config=$T/badkey.ini" "$CM"
# Not a regular file: read as empty (a folder), or a start that never ends.
mkdir "$T/conf-dir"
next_case; reject "config= a folder" 'conf-dir is not a regular file \(it is a folder\)' "$CM" \
	-o "$OK_OPTS,config=$T/conf-dir" "$CM"
next_case; reject "config=/dev/zero" '/dev/zero is not a regular file \(it is a character device\)' \
	"$CM" -o "$OK_OPTS,config=/dev/zero" "$CM"
mkfifo "$T/conf-fifo"
next_case; reject "config= a FIFO" 'conf-fifo is not a regular file \(it is a FIFO\)' "$CM" \
	-o "$OK_OPTS,config=$T/conf-fifo" "$CM"
# Another user's file, even mode 600 with credentials, or one others can change.
printf '[tensorfs]\nthreads = 4\n[s3]\naccess_key_id = k\nsecret_access_key = s\n' >"$T/nobody.ini"
chmod 600 "$T/nobody.ini"
chown 65534:65534 "$T/nobody.ini"
next_case; reject "config file of another user" 'nobody\.ini is owned by uid 65534' "$CM" \
	-o "$OK_OPTS,config=$T/nobody.ini" "$CM"
printf '[tensorfs]\nthreads = 4\n' >"$T/group-w.ini"
chmod 664 "$T/group-w.ini"
next_case; reject "config file writable by its group" 'group-w\.ini is writable by group' "$CM" \
	-o "$OK_OPTS,config=$T/group-w.ini" "$CM"
ln -s "$T/group-w.ini" "$T/link.ini"
next_case; reject "config file that is a link" 'link\.ini is a symbolic link' "$CM" \
	-o "$OK_OPTS,config=$T/link.ini" "$CM"

# Remote tiers and caps.
next_case; reject "missing remote folder" 'no-such-pfs' "$CM" \
	-o "$OK_OPTS,remote=$T/no-such-pfs" "$CM"
next_case; reject "remote that is neither s3 nor a folder" 'remote' "$CM" \
	-o "$OK_OPTS,remote=ftp://x" "$CM"
next_case; reject "bad nvme_bw" 'nvme_bw' "$CM" -o "$OK_OPTS,nvme_bw=fast" "$CM"
next_case; reject "s3 without credentials" 'credential|AWS_' "$CM" \
	-o "$OK_OPTS,remote=s3://bucket/p" "$CM"
next_case; reject "endpoint without remote" 'endpoint|remote' "$CM" \
	-o "$OK_OPTS,endpoint=http://127.0.0.1:1" "$CM"

# A start refused after the store could have been made leaves nothing: not
# the metadata store, and no device identity that a later start would trip on.
mkdir -p "$T/fresh-nvme"
: >"$T/pfs-file" # a remote "folder" that is a file is only found out when opened
next_case; reject "fresh store, remote refused" 'pfs-file|not a directory' "$CM" \
	-o "nvme=$T/fresh-nvme,meta=$T/fresh-meta,dram=256M,remote=$T/pfs-file" "$CM"
next_case; reject "fresh store, dram too small" 'dram' "$CM" \
	-o "nvme=$T/fresh-nvme,meta=$T/fresh-meta,dram=24M,block=4M" "$CM"
[ ! -e "$T/fresh-meta/data.mdb" ] || bad "a refused start left a metadata store in $T/fresh-meta"
[ ! -e "$T/fresh-nvme/tensorfs.dev" ] || bad "a refused start left $T/fresh-nvme/tensorfs.dev"
# Refused by the first nvme folder itself, after its identity was written.
next_case; reject "fresh store, nvme_cap below a block" 'fresh-nvme.*cap' "$CM" \
	-o "nvme=$T/fresh-nvme,meta=$T/fresh-meta,dram=256M,nvme_cap=1" "$CM"
[ -z "$(ls -A "$T/fresh-nvme")" ] || bad "a refused start left $(ls -A "$T/fresh-nvme") in $T/fresh-nvme"
[ ! -e "$T/fresh-meta" ] || bad "a refused start left $T/fresh-meta"
# ... so that a start without the cap makes the store there.
NVME="$T/fresh-nvme" META="$T/fresh-meta" tfs_mount
echo x >"$MNT/x" || bad "cannot write to the store made after a refused start"
tfs_umount || bad "the store made after a refused start: daemon exited non-zero"
# A folder that holds the identity of a store whose meta folder is not given:
# say so, and make no store.
cp "$T/fresh-nvme/tensorfs.dev" "$T/fresh-dev.orig"
next_case; reject "nvme folder of a store whose meta folder is elsewhere" \
	"nvme folder $T/fresh-nvme holds tensorfs\.dev of store [0-9a-f-]+ but meta folder $T/other-meta holds no store: remove $T/fresh-nvme/tensorfs\.dev and $T/fresh-nvme/tensorfs\.slab" \
	"$CM" -o "nvme=$T/fresh-nvme,meta=$T/other-meta,dram=256M" "$CM"
[ ! -e "$T/other-meta" ] || bad "a refused start left $T/other-meta"
cmp -s "$T/fresh-nvme/tensorfs.dev" "$T/fresh-dev.orig" || bad "a refused start changed $T/fresh-nvme/tensorfs.dev"

# A store made on two nvme folders, mounted with one: its count, and the fix.
mkdir -p "$T/two-a" "$T/two-b"
NVME="$T/two-a:$T/two-b" META="$T/two-meta" tfs_mount
head -c $((8 << 20)) /dev/urandom >"$MNT/striped" || bad "writing to the two-folder store"
tfs_umount || bad "the two-folder store: daemon exited non-zero"
next_case; reject "a store of two nvme folders given one" \
	"has 2 devices .* blocks on device 2; this mount gives 1: give every nvme folder of the store, in the order they were given, separated by ':'" \
	"$CM" -o "nvme=$T/two-a,meta=$T/two-meta,dram=256M" "$CM"

# A second daemon on a metadata folder in use.
tfs_mount
head -c 3000000 /dev/urandom >"$T/before"
cp "$T/before" "$MNT/before" && sync "$MNT/before" || bad "cannot write to the first mount"
pid_in_lock=$(head -n1 "$META/lock" 2>/dev/null | tr -d ' ')
[ "$pid_in_lock" = "$TFS_PID" ] || bad "$META/lock holds '$pid_in_lock', daemon pid is $TFS_PID"
mkdir -p "$T/nvme1"
next_case; reject "metadata folder in use" 'lock|in use|busy|running|already' "$CM" \
	-o "nvme=$T/nvme1,meta=$META,dram=256M" "$CM"
kill -0 "$TFS_PID" 2>/dev/null || fail "the first daemon died after the second was refused"
is_mounted "$MNT" || fail "the first mount is gone after the second was refused"
cmp -s "$T/before" "$MNT/before" || bad "first mount: file written before reads back wrong"
echo after >"$MNT/after" && [ "$(cat "$MNT/after")" = after ] || bad "first mount: cannot write after"
tfs_stat_json block_size >/dev/null || bad "first mount: stats unreadable"
pid_in_lock=$(head -n1 "$META/lock" 2>/dev/null | tr -d ' ')
[ "$pid_in_lock" = "$TFS_PID" ] || bad "after the refusal, $META/lock holds '$pid_in_lock'"
tfs_umount || bad "first daemon exited non-zero after unmount"

[ "$FAILS" -eq 0 ] || fail "$FAILS bad-input checks failed"
exit 0
