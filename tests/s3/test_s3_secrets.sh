#!/bin/bash
# S3 credentials never leave the daemon: the secret key, the access key id
# and the session token appear neither in /.tensorfs/config, stats and
# metrics, nor in the daemon's log at log_level=debug, whether they come
# from the environment or from the [s3] section of a config file. A config
# file that holds them and is readable by others is refused.

. "$(dirname "$0")/lib_s3.sh"

S3_TOKEN="tfs-token-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
export AWS_SESSION_TOKEN="$S3_TOKEN" TFS_DRAM=128M TFS_THREADS=8

# check_no_leak WHAT: the control files and the log hold no credential.
check_no_leak() {
	local f
	for f in config stats metrics; do
		[ -e "$MNT/.tensorfs/$f" ] || continue
		cat "$MNT/.tensorfs/$f" >"$T/ctl-$f" || fail "$1: cannot read .tensorfs/$f"
		s3_secret_leaks "$T/ctl-$f"
		grep -qF "$S3_TOKEN" "$T/ctl-$f" && fail "$1: the session token is in $f"
	done
	grep -q '"s3"' "$T/ctl-config" || fail "$1: .tensorfs/config does not describe the s3 tier"
	s3_secret_leaks "$LOG"
	grep -qF "$S3_TOKEN" "$LOG" && fail "$1: the session token is in the log"
	true
}

s3_start

# From the environment, with a session token (sent, signed, ignored by s3rver).
OPTS="$(s3_mount_opts secrets),log_level=debug"
tfs_mount "$OPTS"
head -c 8M /dev/urandom >"$T/data"
cp "$T/data" "$MNT/f" && sync "$MNT/f" || fail "write through s3 with a session token"
[ "$(tfs_stat_json tiers s3 write_bytes)" -gt 0 ] || fail "nothing was written to s3"
check_no_leak "credentials from the environment"
# The daemon wipes the secrets from its environment block and may not dump core.
tr '\0' '\n' </proc/"$TFS_PID"/environ >"$T/environ" || fail "cannot read the daemon's environ"
grep -qF "$S3_SECRET" "$T/environ" && fail "the secret key is in /proc/PID/environ"
grep -qF "$S3_TOKEN" "$T/environ" && fail "the session token is in /proc/PID/environ"
grep -q '^AWS_ACCESS_KEY_ID=' "$T/environ" || fail "the environ check read the wrong process"
tfs_umount || fail "tensorfs exited $? after unmount"
s3_secret_leaks "$LOG"

# From a config file, mode 600, and nothing in the environment.
CONF="$T/tensorfs.conf"
printf '[s3]\naccess_key_id = %s\nsecret_access_key = %s\nsession_token = %s\n' \
	"$S3_KEY" "$S3_SECRET" "$S3_TOKEN" >"$CONF"
chmod 600 "$CONF"
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN
tfs_mount "$OPTS,config=$CONF"
cmp -s "$T/data" "$MNT/f" || fail "f differs when mounted with credentials from a config file"
[ "$(tfs_stat_json tiers s3 read_bytes)" -gt 0 ] || fail "nothing was read from s3"
check_no_leak "credentials from a config file"
tfs_umount || fail "tensorfs exited $? after unmount"

# Readable by the group: refused, without printing what it holds.
chmod 640 "$CONF"
rc=0
timeout 30 "$TENSORFS" -f -o "nvme=$NVME,meta=$META,dram=128M,threads=8,$OPTS,config=$CONF" \
	"$MNT" >"$T/refused.out" 2>&1 || rc=$?
is_mounted "$MNT" && fail "mounted with a config file readable by others"
[ $rc -ne 0 ] || fail "a config file readable by others was accepted"
grep -q "$CONF" "$T/refused.out" || fail "the refusal does not name the config file: $(cat "$T/refused.out")"
s3_secret_leaks "$T/refused.out" "$LOG"
echo "   mode 640 refused: $(head -n1 "$T/refused.out")"

echo "PASS: credentials appear in no control file and no log"
exit 0
