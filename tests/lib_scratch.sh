# What the tests of the build and its tools share (install, gpu-pack,
# bench-plot, bench-swap): fail, and a scratch folder $W, removed on exit.
# Source it as: . "$(dirname "$0")/lib_scratch.sh" NAME
# (the folder: ${TMPDIR:-/var/tmp}/tfs-NAME.XXXXXX).
W=$(mktemp -d "${TMPDIR:-/var/tmp}/tfs-$1.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
