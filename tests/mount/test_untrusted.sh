#!/bin/bash
# What another local user (nobody) can plant where a root daemon is told to
# write, and what it can make tfsctl and the daemon print
# (docs/security.md):
#
#   1. logfile= is opened before the mount reports success: a FIFO, a link
#      or another user's file planted in a sticky folder, a file with a
#      second link or writable by others, and a folder that does not
#      exist each refuse the start, within 30 s, naming the file, and the
#      planted files stay as they were; a file of our own is made 0600
#      and receives the log. (Regression: the log was opened after the
#      mount was reported, a FIFO hung the daemon with the mount live,
#      another user's file received root's log, and a failed open was
#      ignored.)
#   2. meta=, nvme=, the folder of logfile= and of config= through a link
#      of another user (in a folder of theirs, or in a sticky one) are
#      refused, naming the link, and nothing is written where it points;
#      a link of root's is followed. (Regression: meta= and config=
#      followed any link, nvme= resolved them with realpath.)
#   3. remote=s3://KEY:SECRET@bucket, from -o or the config file, in any
#      case of the scheme and with a '/' in the secret, is refused and
#      the secret is printed nowhere. (Regression: it was taken as the
#      bucket name, and printed in messages, the config, stats and log.)
#   4. Names are printed escaped: a file named with a newline, a fake row
#      and a terminal escape, pinned, is one row of tfsctl pins, and
#      tfsctl where, the error of a missing one, config (a meta folder
#      with such a name), the --json outputs, tfsctl fsck and the
#      daemon's log show no control byte and no forged line.
#      (Regression: tfsctl printed names raw.)

. "$(dirname "$0")/lib.sh"
: "${TFSCTL:?TFSCTL must name the tfsctl binary}"
: "${METACORRUPT:?METACORRUPT must name the metacorrupt program}"

[ "$(id -u)" = 0 ] || skip "needs root, to play another user (nobody)"
command -v setpriv >/dev/null || skip "setpriv not found"
command -v python3 >/dev/null || skip "python3 not found"
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
chmod 755 "$T" # so that nobody can reach its folders
mkdir -m 1777 "$T/sticky" # a /tmp of its own
echo "root's own" >"$T/victim"
cp "$T/victim" "$T/victim.orig"

# start OPTS: the daemon in the background, as a service starts it, the
# metadata in $M; RC is its exit status and, when it mounted, TFS_PID is
# the daemon's (from its lock file).
start() {
	RC=0
	timeout 30 "$TENSORFS" -o "$1,dram=256M,threads=4" "$MNT" >"$T/start.out" 2>&1 || RC=$?
	if is_mounted "$MNT"; then
		TFS_PID=$(head -n 1 "$M/lock" 2>/dev/null)
	fi
}
# stop: unmount the background daemon and wait for it to end (30 s).
stop() {
	fusermount3 -u "$MNT" || fail "fusermount3 -u failed"
	for _ in $(seq 1 300); do
		alive "$TFS_PID" || break
		sleep 0.1
	done
	alive "$TFS_PID" && fail "the daemon did not end 30 s after its unmount"
	TFS_PID=""
}
# refused NAME PATTERN OPTS: the start with OPTS is refused, saying PATTERN
# (a fixed string), mounting nothing, and the victim stays as it was.
refused() {
	start "$3"
	is_mounted "$MNT" && fail "$1: the mount went ahead (exit $RC): $(cat "$T/start.out")"
	[ $RC -ne 0 ] && [ $RC -ne 124 ] || fail "$1: tensorfs exited $RC: $(cat "$T/start.out")"
	grep -qF -- "$2" "$T/start.out" || fail "$1: no message with '$2': $(cat "$T/start.out")"
	cmp -s "$T/victim" "$T/victim.orig" || fail "$1: the victim was changed"
	echo "   $1: refused ($(tail -n 1 "$T/start.out"))"
}

echo "1. logfile="
mkdir -p "$T/n1"
M=$T/m1
O1="nvme=$T/n1,meta=$M"
nobody mkfifo "$T/sticky/fifo.log"
refused "a FIFO of nobody's" "logfile $T/sticky/fifo.log" "$O1,logfile=$T/sticky/fifo.log"
nobody ln -s "$T/victim" "$T/sticky/link.log"
refused "a link of nobody's to root's file" "logfile $T/sticky/link.log" "$O1,logfile=$T/sticky/link.log"
nobody sh -c "echo theirs >'$T/sticky/theirs.log'"
refused "a file of nobody's" "logfile $T/sticky/theirs.log is owned by uid 65534" \
	"$O1,logfile=$T/sticky/theirs.log"
[ "$(cat "$T/sticky/theirs.log")" = theirs ] || fail "nobody's log file was written to"
ln "$T/victim" "$T/sticky/hard.log"
refused "a second link to root's file" "logfile $T/sticky/hard.log has 2 links" \
	"$O1,logfile=$T/sticky/hard.log"
: >"$T/open.log"
chmod 666 "$T/open.log"
refused "a file others can write" "logfile $T/open.log is writable by group or others" \
	"$O1,logfile=$T/open.log"
refused "a folder that does not exist" "logfile $T/no-such/x.log" "$O1,logfile=$T/no-such/x.log"
[ ! -e "$M" ] || fail "a refused start made the meta folder $M"
mkdir -m 755 "$T/logs"
start "$O1,logfile=$T/logs/good.log"
is_mounted "$MNT" || fail "did not mount with logfile=$T/logs/good.log: $(cat "$T/start.out")"
[ "$(stat -c '%a %u' "$T/logs/good.log")" = "600 0" ] ||
	fail "the log was made $(stat -c '%a %u' "$T/logs/good.log") (mode, owner), not 600 0"
echo data >"$MNT/f" || fail "cannot write"
stop
grep -q "unmounted" "$T/logs/good.log" || fail "the log file does not hold the daemon's log"
echo "   a file of root's own: made 600, receives the log"

echo "2. links of another user on the way"
mkdir -p "$T/n2"
mkdir -m 700 "$T/root-meta" "$T/root-nvme" "$T/root-logs" "$T/root-cfg"
printf '[tensorfs]\nprefetch = on\n' >"$T/root-cfg/t.conf"
chmod 600 "$T/root-cfg/t.conf"
mkdir -m 755 "$T/nobodys"
chown 65534:65534 "$T/nobodys"
for d in meta nvme logs cfg; do
	nobody ln -s "$T/root-$d" "$T/nobodys/$d"
done
nobody ln -s "$T/root-meta" "$T/sticky/meta"
M=$T/m2
O2="nvme=$T/n2,meta=$M"
link="is a symbolic link of uid 65534"
refused "meta= through nobody's link" "meta folder $T/nobodys/meta: $T/nobodys/meta $link" \
	"nvme=$T/n2,meta=$T/nobodys/meta"
refused "meta= through nobody's link in a sticky folder" "$T/sticky/meta $link" \
	"nvme=$T/n2,meta=$T/sticky/meta"
refused "meta= below nobody's link" "$T/nobodys/meta $link" "nvme=$T/n2,meta=$T/nobodys/meta/sub"
refused "nvme= through nobody's link" "nvme folder $T/nobodys/nvme: $T/nobodys/nvme $link" \
	"nvme=$T/nobodys/nvme,meta=$M"
refused "logfile= in a folder through nobody's link" "logfile $T/nobodys/logs/x.log: $T/nobodys/logs $link" \
	"$O2,logfile=$T/nobodys/logs/x.log"
refused "config= in a folder through nobody's link" "config file $T/nobodys/cfg/t.conf: $T/nobodys/cfg $link" \
	"$O2,config=$T/nobodys/cfg/t.conf"
for d in meta nvme logs; do
	[ -z "$(ls -A "$T/root-$d")" ] || fail "a refused start wrote into $T/root-$d: $(ls -A "$T/root-$d")"
done
[ ! -e "$M" ] || fail "a refused start made the meta folder $M"
ln -s "$T/root-meta" "$T/meta-link"
M=$T/root-meta
start "nvme=$T/n2,meta=$T/meta-link"
is_mounted "$MNT" || fail "meta= through a link of root's did not mount: $(cat "$T/start.out")"
grep -qF "\"meta\": \"$T/root-meta\"" "$MNT/.tensorfs/config" ||
	fail "the config does not name the meta folder where the link leads"
stop
[ -e "$T/root-meta/data.mdb" ] || fail "the store is not where root's link leads"
echo "   a link of root's: followed"

echo "3. remote=s3:// with a user and password"
pw="PW$RANDOM$RANDOM$RANDOM"
mkdir -p "$T/n3"
# secret_refused OPTS PATTERN: refused, saying PATTERN, with $pw nowhere.
secret_refused() {
	local rc=0
	AWS_ACCESS_KEY_ID=k AWS_SECRET_ACCESS_KEY=s timeout 30 "$TENSORFS" -f -o \
		"nvme=$T/n3,meta=$T/m3,dram=256M,threads=4,remote_timeout=2,$1" "$MNT" \
		>"$T/secret.out" 2>&1 || rc=$?
	is_mounted "$MNT" && fail "mounted with $1"
	[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "tensorfs exited $rc with $1"
	grep -qF "$pw" "$T/secret.out" && fail "the secret in remote= was printed: $(cat "$T/secret.out")"
	grep -qE "$2" "$T/secret.out" || fail "no reason (/$2/) given for $1: $(cat "$T/secret.out")"
	[ ! -e "$T/m3/data.mdb" ] || fail "$1 was refused after a metadata store was made"
	echo "   refused: $(tail -n 1 "$T/secret.out")"
}
ep="endpoint=http://127.0.0.1:9"
secret_refused "remote=s3://AKIAEXAMPLE:$pw@bucket/pre,$ep" "user or password"
secret_refused "remote=s3://AKIAEXAMPLE:ab/$pw@bucket,$ep" "user or password"
secret_refused "remote=s3://$pw@bucket" "user or password"
secret_refused "remote=S3://AKIAEXAMPLE:$pw@bucket,$ep" "not shown"
secret_refused "remote=s3://bu\$$pw,$ep" "not a bucket name"
printf '[tensorfs]\nremote = s3://AKIAEXAMPLE:%s@bucket\n' "$pw" >"$T/s3.conf"
chmod 600 "$T/s3.conf"
secret_refused "config=$T/s3.conf,$ep" "user or password"

echo "4. names are printed escaped"
# clean FILE: no control byte but newline, nothing past ASCII with --json.
clean() {
	python3 - "$@" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
bad = [b for b in data if (b < 0x20 and b != 0x0a) or b == 0x7f]
if bad:
    sys.exit("%s holds control bytes %s" % (sys.argv[1], sorted(set(bad))))
if len(sys.argv) > 2 and any(b >= 0x80 for b in data):
    sys.exit("%s holds bytes past ASCII" % sys.argv[1])
for line in data.split(b"\n"):
    if line.startswith(b"fake-row") or line.startswith(b"tensorfs: error: forged"):
        sys.exit("%s has a forged line: %r" % (sys.argv[1], line))
PY
}
evil=$'evil\nfake-row 1 2 3 \e[31m\xc2\x9b2J'
evil_esc='evil\x0afake-row 1 2 3 \x1b[31m\xc2\x9b2J'
META="$T/meta-"$'\e]0;x\a\ntensorfs: error: forged line'
meta_esc='meta-\x1b]0;x\x07\x0atensorfs: error: forged line'
TFS_THREADS=4 tfs_mount
head -c 100000 /dev/urandom >"$MNT/$evil" || fail "cannot make a file named with controls"
"$TFSCTL" -m "$MNT" pin "$MNT/$evil" || fail "tfsctl pin of the file"
"$TFSCTL" -m "$MNT" pins >"$T/pins.out" 2>&1 || fail "tfsctl pins: $(cat "$T/pins.out")"
clean "$T/pins.out" || fail "tfsctl pins printed a name raw: $(cat -v "$T/pins.out")"
[ "$(wc -l <"$T/pins.out")" -eq 2 ] || fail "tfsctl pins: not one header and one row: $(cat -v "$T/pins.out")"
grep -qF "$evil_esc" "$T/pins.out" || fail "tfsctl pins does not show the name escaped: $(cat "$T/pins.out")"
"$TFSCTL" -m "$MNT" pins --json >"$T/pins.json" || fail "tfsctl pins --json"
clean "$T/pins.json" ascii || fail "tfsctl pins --json printed a name raw"
python3 - "$T/pins.json" "$evil" <<'PY' || fail "tfsctl pins --json does not name the file exactly"
import json, sys
want = sys.argv[2].encode("utf-8", "surrogateescape").decode("utf-8")
assert [p["path"] for p in json.load(open(sys.argv[1]))["pins"]] == ["/" + want]
PY
"$TFSCTL" -m "$MNT" where "$MNT/$evil" >"$T/where.out" 2>&1 || fail "tfsctl where: $(cat "$T/where.out")"
clean "$T/where.out" || fail "tfsctl where printed the path raw: $(cat -v "$T/where.out")"
grep -qF "$evil_esc" "$T/where.out" || fail "tfsctl where does not show the path escaped"
"$TFSCTL" -m "$MNT" where "$MNT/$evil-gone" >"$T/gone.out" 2>&1 && fail "tfsctl where of a missing file"
clean "$T/gone.out" || fail "tfsctl's error printed the path raw: $(cat -v "$T/gone.out")"
"$TFSCTL" -m "$MNT" config >"$T/config.out" 2>&1 || fail "tfsctl config"
clean "$T/config.out" || fail "tfsctl config printed the meta folder raw: $(cat -v "$T/config.out")"
grep -qF "$meta_esc" "$T/config.out" || fail "tfsctl config does not show the meta folder escaped"
"$TFSCTL" -m "$MNT" config --json >"$T/config.json" || fail "tfsctl config --json"
clean "$T/config.json" ascii || fail "tfsctl config --json printed the meta folder raw"
"$TFSCTL" -m "$MNT" stats >"$T/stats.out" 2>&1 || fail "tfsctl stats"
clean "$T/stats.out" || fail "tfsctl stats printed a control byte"
ino=$(stat -c %i "$MNT/$evil")
tfs_umount || fail "unmount"
clean "$LOG" || fail "the daemon's log holds a control byte or a forged line: $(cat -v "$LOG")"
grep -qF "$meta_esc" "$LOG" || fail "the daemon's log does not name the meta folder escaped"
"$METACORRUPT" "$META" set-count "$ino" 99 >/dev/null || fail "metacorrupt set-count"
"$TFSCTL" fsck "$META" >"$T/fsck.out" 2>&1
[ $? -eq 1 ] || fail "tfsctl fsck did not find the wrong count: $(cat -v "$T/fsck.out")"
clean "$T/fsck.out" || fail "tfsctl fsck printed the name raw: $(cat -v "$T/fsck.out")"
grep -qF "$evil_esc" "$T/fsck.out" || fail "tfsctl fsck does not name the file escaped: $(cat "$T/fsck.out")"
echo "   pins, where, config, stats, --json, fsck and the log: escaped"

echo "PASS: untrusted paths and names"
exit 0
