#!/bin/sh
# test_corrupt.sh - swapbench notices data that is not what it wrote.
#
# Between iterations, a --between hook damages the optimizer state on disk:
#   junk:      4 KiB of junk at offset 3145728 of the first exp_avg file;
#   stale:     two blocks of an exp_avg_sq file, saved after iteration 1, put
#              back after iteration 2;
#   truncated: the first weights file cut to 4 KiB.
# Each run must fail with a non-zero exit status and name the file (and the
# offset) on stderr.  The control run, with a hook that changes nothing, must
# pass: so must-fail runs fail because of the damage, not of the hook.
#
# SWAPBENCH: the binary.  SWAPBENCH_TARGET: the folder to test (default: a
# new one under ${TMPDIR:-/var/tmp}); a fresh subfolder is made in it.
# Exit status: 0 pass, 1 fail, 77 skip.

# The hooks are shell text that swapbench runs later: their $ expand then.
# shellcheck disable=SC2016

set -u
: "${SWAPBENCH:=swapbench}"
base=${SWAPBENCH_TARGET:-${TMPDIR:-/var/tmp}}
small="--params 2e7 --sub-group-size 1e7 --iters 3"
opt='"$SWAPBENCH_DIR"/zero_stage_3/optimizer/rank0'

. "$(dirname "$0")/test_lib.sh"
make_work corrupt
# The junk: 4 KiB of 0xa5 bytes.
head -c 4096 /dev/zero | tr '\000' '\245' >"$work/junk.bin"

fail=0

# attempt NAME HOOK: run with --between HOOK; leaves the status in $st.
attempt() {
	dir="$work/$1"
	rm -rf "$dir"
	mkdir "$dir"
	# shellcheck disable=SC2086 # $small is a list of options
	WORK="$work" "$SWAPBENCH" $small --between "$2" "$dir" >"$work/out.txt" 2>"$work/err.txt"
	st=$?
}

# must_fail NAME HOOK PATTERN...: non-zero status, and stderr has each pattern.
must_fail() {
	name=$1 hook=$2
	shift 2
	attempt "$name" "$hook"
	if [ "$st" -eq 0 ]; then
		echo "FAIL $name: exit status 0 despite the damage"
		fail=1
		return
	fi
	if [ ! -s "$work/damaged" ]; then
		echo "FAIL $name: the hook did not run"
		fail=1
		return
	fi
	damaged=$(cat "$work/damaged")
	for pattern in "$damaged" "$@"; do
		if ! grep -qF -- "$pattern" "$work/err.txt"; then
			echo "FAIL $name: stderr does not say '$pattern':"
			cat "$work/err.txt"
			fail=1
			return
		fi
	done
	echo "ok   $name (exit status $st)"
	rm -f "$work/damaged"
}

# The hooks run under sh -c; WORK is the test's folder, passed in the environment.
touch_hook='[ "$SWAPBENCH_ITER" = 1 ] && ls '$opt'/exp_avg-*.tensor.swp >"$WORK/damaged"; true'

junk_hook='if [ "$SWAPBENCH_ITER" = 1 ]; then
	f=$(ls '$opt'/exp_avg-*.tensor.swp | head -n 1)
	dd if="$WORK/junk.bin" of="$f" bs=4096 seek=768 count=1 conv=notrunc status=none || exit 1
	echo "$f" >"$WORK/damaged"
fi'

stale_hook='f=$(ls '$opt'/exp_avg_sq-*.tensor.swp | head -n 1)
if [ "$SWAPBENCH_ITER" = 1 ]; then
	cp "$f" "$WORK/stale.bin" || exit 1
elif [ "$SWAPBENCH_ITER" = 2 ]; then
	dd if="$WORK/stale.bin" of="$f" bs=4096 skip=100 seek=100 count=2 conv=notrunc status=none || exit 1
	echo "$f" >"$WORK/damaged"
fi'

truncate_hook='if [ "$SWAPBENCH_ITER" = 1 ]; then
	f=$(ls '$opt'/*.tensor.swp | grep -v -e exp_avg -e _gradient_ | head -n 1)
	truncate -s 4096 "$f" || exit 1
	echo "$f" >"$WORK/damaged"
fi'

attempt control "$touch_hook"
if [ "$st" -ne 0 ] || [ ! -s "$work/damaged" ]; then
	echo "FAIL control: exit status $st, hook ran: $([ -s "$work/damaged" ] && echo yes || echo no)"
	cat "$work/err.txt"
	fail=1
else
	echo "ok   control"
fi
rm -f "$work/damaged"

must_fail junk "$junk_hook" "offset 3145728"
must_fail stale "$stale_hook" "offset 409600: expected iter 2 got iter 1"
must_fail truncated "$truncate_hook" "file is 4096 bytes"

exit $fail
