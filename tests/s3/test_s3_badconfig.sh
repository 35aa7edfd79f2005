#!/bin/bash
# A remote=s3:// tier that cannot work makes the mount fail, with a message
# that names the cause, a non-zero exit and nothing mounted:
#   - a wrong secret (SignatureDoesNotMatch) and an unknown access key id
#     (InvalidAccessKeyId): "wrong credentials", from the environment and
#     from the [s3] section of a config file;
#   - a bucket that does not exist (NoSuchBucket);
#   - an endpoint that refuses connections, a host name that does not
#     resolve, and a server that accepts connections but never answers
#     (remote_timeout=2).
#   - the credentials in the endpoint URL, with the scheme in capitals or
#     not http(s) at all: refused before any connection, and never printed
#     (regression of issue 12: the whole URL was in the message).
# The wrong secret never appears in what the daemon prints. Then a mount with
# the right credentials works, so the failures above are the server's verdict,
# and so does one whose endpoint's scheme is in capitals.

. "$(dirname "$0")/lib_s3.sh"

SILENT_PID=""
s3_test_cleanup() {
	if [ -n "$SILENT_PID" ]; then
		kill "$SILENT_PID" 2>/dev/null
		wait "$SILENT_PID" 2>/dev/null
	fi
}

s3_start
mkdir -p "$META"

# expect_refused WHAT PATTERN OPTIONS [ENV...]: the mount fails and says PATTERN.
expect_refused() {
	local what=$1 pattern=$2 opts=$3 out="$T/refused.out" rc=0 start
	shift 3
	start=$(date +%s)
	env "$@" timeout 60 "$TENSORFS" -f -o "nvme=none,meta=$META,dram=128M,threads=8,$opts" "$MNT" \
		>"$out" 2>&1 || rc=$?
	if is_mounted "$MNT"; then
		fusermount3 -u -z "$MNT"
		fail "$what: tensorfs mounted"
	fi
	[ $rc -ne 0 ] || fail "$what: tensorfs exited 0"
	[ $rc -ne 124 ] || fail "$what: tensorfs hung for 60 s"
	grep -q -- "$pattern" "$out" || {
		cat "$out" >&2
		fail "$what: no message matching '$pattern'"
	}
	s3_secret_leaks "$out" # the wrong secrets below hold the right one
	echo "   $what: exit $rc in $(($(date +%s) - start)) s: $(grep -m1 -- "$pattern" "$out")"
}

GOOD="$(s3_mount_opts bad)"

expect_refused "wrong secret" "wrong credentials (SignatureDoesNotMatch)" "$GOOD" \
	AWS_SECRET_ACCESS_KEY="wrong-$S3_SECRET"
expect_refused "unknown access key id" "wrong credentials (InvalidAccessKeyId)" "$GOOD" \
	AWS_ACCESS_KEY_ID="NO$S3_KEY"

# The same through a config file, mode 600, with no credentials in the environment.
CONF="$T/tensorfs.conf"
printf '[s3]\naccess_key_id = %s\nsecret_access_key = wrong-%s\n' \
	"$S3_KEY" "$S3_SECRET" >"$CONF"
chmod 600 "$CONF"
expect_refused "wrong secret in a config file" "wrong credentials" "$GOOD,config=$CONF" \
	-u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY

expect_refused "no such bucket" "does not exist.*NoSuchBucket" \
	"remote=s3://no-such-bucket/x,endpoint=$S3_ENDPOINT"

# A port nothing listens on: take a free one from the kernel, then close it.
FREE_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
expect_refused "connection refused" "unreachable.*onnect" \
	"remote=s3://$S3_BUCKET/x,endpoint=http://127.0.0.1:$FREE_PORT"
expect_refused "unknown host" "unreachable.*resolve" \
	"remote=s3://$S3_BUCKET/x,endpoint=http://no-such-host.invalid:9000"

# A server that accepts connections and never answers: the mount gives up
# after remote_timeout.
python3 -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
conns = []
while True:
    c, _ = s.accept()
    conns.append(c)
' >"$T/silent.port" &
SILENT_PID=$!
for _ in $(seq 1 100); do
	[ -s "$T/silent.port" ] && break
	sleep 0.05
done
[ -s "$T/silent.port" ] || fail "the silent server did not start"
expect_refused "server that never answers" "unreachable.*timed out" \
	"remote=s3://$S3_BUCKET/x,endpoint=http://127.0.0.1:$(cat "$T/silent.port"),remote_timeout=2"

expect_refused "credentials in the endpoint URL, HTTP://" "user or password" \
	"remote=s3://$S3_BUCKET/x,endpoint=HTTP://$S3_KEY:$S3_SECRET@127.0.0.1:$S3_PORT/"
expect_refused "credentials in an ftp:// endpoint URL" "user or password" \
	"remote=s3://$S3_BUCKET/x,endpoint=ftp://$S3_KEY:$S3_SECRET@127.0.0.1:$S3_PORT/"
expect_refused "the secret in the endpoint URL's query" "query" \
	"remote=s3://$S3_BUCKET/x,endpoint=http://127.0.0.1:$S3_PORT/?k=$S3_SECRET"

# And the right credentials mount.
tfs_mount "nvme=none,$GOOD"
echo hello >"$MNT/f" || fail "write with the right credentials"
tfs_umount || fail "tensorfs exited $? after unmount"

# Another prefix holds none of the store's blocks: refused, naming it.
expect_refused "the store's blocks under another prefix" \
	"s3 tier s3://$S3_BUCKET/upper/.* has no tensorfs\.dev, but this store holds 1 blocks on it" \
	"remote=s3://$S3_BUCKET/upper,endpoint=http://127.0.0.1:$S3_PORT,region=$S3_REGION"

# The scheme in capitals is the same endpoint (a new store: its blocks go under upper/).
META="$T/meta-upper"
tfs_mount "nvme=none,remote=s3://$S3_BUCKET/upper,endpoint=HTTP://127.0.0.1:$S3_PORT,region=$S3_REGION"
echo hello >"$MNT/f" && sync "$MNT/f" || fail "write through an HTTP:// endpoint"
tfs_umount || fail "tensorfs exited $? after unmount (HTTP:// endpoint)"
find "$S3_DATA" -path "*upper*" | grep -q . || fail "nothing was stored under the HTTP:// endpoint's prefix"

echo "PASS: bad s3 configurations are refused at mount with clear messages"
exit 0
