# test_lib.sh - what swapbench's tests share (sourced, POSIX sh).
#
# make_work NAME: a fresh folder $work under $base (swapbench-NAME.XXXXXX),
# removed on exit; the test skips (77) when none can be made there or the
# folder does not support O_DIRECT.

make_work() {
	work=$(mktemp -d "$base/swapbench-$1.XXXXXX") || { echo "skip: no folder in $base"; exit 77; }
	trap 'rm -rf "$work"' EXIT
	trap 'exit 1' INT TERM HUP PIPE

	if ! dd if=/dev/zero of="$work/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
		echo "skip: $base does not support O_DIRECT"
		exit 77
	fi
	rm -f "$work/probe"
}
