# Shared helpers for the s3 tier tests: an S3 server on 127.0.0.1.
#
# Source it from a test script, after which the mount helpers of
# tests/mount/lib.sh are there too ($T, $MNT, $NVME, $META, $LOG,
# tfs_mount, tfs_umount, tfs_stat_json, fail, skip).
#
# The server is s3rver (tests/package.json; `npm ci --prefix tests`), which
# checks SigV4 signatures. It listens on a free port and keeps its objects in
# $T/s3data, so that it can be killed and started again on the same port
# over the same data. Each test run gets credentials of its own, registered
# with the server at start, so that a grep for the secret finds nothing but
# a leak: $S3_KEY and $S3_SECRET, exported as AWS_ACCESS_KEY_ID and
# AWS_SECRET_ACCESS_KEY. Also exported: S3_ENDPOINT, S3_BUCKET.
#
#   s3_start      start the server (on $S3_PORT when set, else a free port)
#   s3_stop       stop it (SIGTERM), by pid
#   s3_kill       kill it (SIGKILL), as a crash would
#   s3_restart    stop it if running, start it again on the same port
#   s3_mount_opts PREFIX [extra]   -o options of a tier in the test bucket
#   s3_proxy_start [MS]  put tools/s3proxy.js in front of the server: each
#                 request waits MS (default 0) and is counted; S3_ENDPOINT
#                 becomes the proxy's, S3_PROXY_LOG its log (a line each)
#   s3_proxy_count [METHOD]  requests the proxy has seen (of one method)
#   settle DESC TEST  wait (20 s at most) until TEST holds, else fail

. "$(dirname "${BASH_SOURCE[0]}")/../mount/lib.sh"

: "${TFS_SRC:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
S3RVER_DIR="$TFS_SRC/tests/node_modules/@20minutes/s3rver"

command -v node >/dev/null || skip "node is not installed (Debian: apt-get install nodejs npm)"
[ -f "$S3RVER_DIR/lib/cli.js" ] ||
	skip "s3rver is not installed: run 'npm ci --prefix tests' in $TFS_SRC"

S3_DATA="$T/s3data"
S3_PROXY_PID=""
S3_PROXY_LOG="$T/s3proxy.requests"
S3_LOG="$T/s3rver.log"
S3_PID=""
S3_PORT=""
S3_BUCKET=tfs-test
S3_REGION=us-east-1
S3_START_WAIT=${S3_START_WAIT:-30} # seconds; node starts slowly on a busy machine

# Credentials of this run only; the server knows them from its environment.
S3_KEY="TFSKEY$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n' | tr a-f A-F)"
S3_SECRET="tfs-secret-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
export AWS_ACCESS_KEY_ID="$S3_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET"
unset AWS_SESSION_TOKEN
# The server is local: no proxy in between.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY

# Start s3rver with the test credentials added to its built-in account.
S3RVER_MAIN='
const dir = process.env.S3RVER_DIR;
require(dir + "/lib/models/account").DUMMY_ACCOUNT.createKeyPair(
	process.env.S3_TEST_KEY, process.env.S3_TEST_SECRET);
require(dir + "/lib/cli").parseAsync(["node", "s3rver", ...process.argv.slice(1)])
	.catch((e) => { console.error("s3rver: " + e.message); process.exit(1); });
'

# listen_port PIDVAR FILE NAME EXITED WHO: wait, S3_START_WAIT s at the most,
# until the server whose pid PIDVAR holds says in FILE "NAME listening on
# 127.0.0.1:PORT"; PORT in LISTEN_PORT. Fails with EXITED (after FILE, and
# with PIDVAR cleared) where the server exits first, or says WHO did not
# listen in time.
listen_port() {
	local pid=${!1}
	LISTEN_PORT=""
	for _ in $(seq 1 $((S3_START_WAIT * 20))); do
		LISTEN_PORT=$(sed -n "s/^$3 listening on 127\.0\.0\.1:\([0-9]*\)\$/\1/p" "$2")
		[ -z "$LISTEN_PORT" ] || return 0
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid" 2>/dev/null
			printf -v "$1" '%s' ""
			cat "$2" >&2
			fail "$4"
		fi
		sleep 0.05
	done
	fail "$5 did not listen within $S3_START_WAIT s"
}

s3_start() {
	[ -z "$S3_PID" ] || fail "s3_start: s3rver is already running (pid $S3_PID)"
	mkdir -p "$S3_DATA"
	: >"$S3_LOG.start"
	S3RVER_DIR="$S3RVER_DIR" S3_TEST_KEY="$S3_KEY" S3_TEST_SECRET="$S3_SECRET" \
		node -e "$S3RVER_MAIN" -- -d "$S3_DATA" -a 127.0.0.1 -p "${S3_PORT:-0}" --silent \
		--configure-bucket "$S3_BUCKET" >"$S3_LOG.start" 2>&1 &
	S3_PID=$!
	listen_port S3_PID "$S3_LOG.start" S3rver "s3rver exited at start (port ${S3_PORT:-any})" \
		s3rver
	cat "$S3_LOG.start" >>"$S3_LOG"
	S3_PORT=$LISTEN_PORT
	S3_ENDPOINT="http://127.0.0.1:$S3_PORT"
	export S3_ENDPOINT S3_BUCKET
}

# s3_stop [SIGNAL]: stop the server we started, by its pid.
s3_stop() {
	[ -n "$S3_PID" ] || return 0
	kill "-${1:-TERM}" "$S3_PID" 2>/dev/null
	wait "$S3_PID" 2>/dev/null
	S3_PID=""
}

s3_kill() {
	s3_stop KILL
}

s3_restart() {
	s3_stop
	s3_start
}

# s3_proxy_start [MS]: the proxy of tools/s3proxy.js between the tests'
# clients and the server, started after s3_start.
s3_proxy_start() {
	[ -n "$S3_PORT" ] || fail "s3_proxy_start: start the server first"
	[ -z "$S3_PROXY_PID" ] || fail "s3_proxy_start: the proxy is already running"
	: >"$S3_PROXY_LOG"
	: >"$T/s3proxy.out"
	node "$TFS_SRC/tools/s3proxy.js" --upstream "http://127.0.0.1:$S3_PORT" \
		--latency-ms "${1:-0}" --log "$S3_PROXY_LOG" >"$T/s3proxy.out" 2>&1 &
	S3_PROXY_PID=$!
	listen_port S3_PROXY_PID "$T/s3proxy.out" s3proxy "tools/s3proxy.js exited at start" \
		tools/s3proxy.js
	S3_ENDPOINT="http://127.0.0.1:$LISTEN_PORT"
	export S3_ENDPOINT
}

s3_proxy_stop() {
	[ -n "$S3_PROXY_PID" ] || return 0
	kill "$S3_PROXY_PID" 2>/dev/null
	wait "$S3_PROXY_PID" 2>/dev/null
	S3_PROXY_PID=""
}

# s3_proxy_count [METHOD]: requests the proxy has seen so far.
s3_proxy_count() {
	if [ -n "${1:-}" ]; then
		grep -c "^$1 " "$S3_PROXY_LOG"
	else
		wc -l <"$S3_PROXY_LOG"
	fi
}

# s3_mount_opts PREFIX: options for a remote tier under PREFIX in the bucket.
s3_mount_opts() {
	echo "remote=s3://$S3_BUCKET/$1,endpoint=$S3_ENDPOINT,region=$S3_REGION"
}

# settle DESC TEST: wait (20 s at most) until the shell test TEST holds;
# else fail with DESC and what the command in SETTLE_DETAIL (when set) prints.
settle() {
	local i
	for i in $(seq 1 200); do
		eval "$2" && return 0
		sleep 0.1
	done
	fail "$1${SETTLE_DETAIL:+ ($(eval "$SETTLE_DETAIL"))}"
}

# s3_secret_leaks FILE...: fail if a file holds the secret or the key id.
s3_secret_leaks() {
	local f
	for f in "$@"; do
		[ -e "$f" ] || continue
		if grep -aqF -e "$S3_SECRET" -e "$S3_KEY" "$f"; then
			fail "credentials appear in $f"
		fi
	done
}

# Runs from lib.sh's EXIT trap after the unmount; a test may add its own
# cleanup as s3_test_cleanup.
tfs_extra_cleanup() {
	if declare -F s3_test_cleanup >/dev/null; then
		s3_test_cleanup
	fi
	s3_proxy_stop
	s3_stop
}
