#!/bin/bash
# Run one libFuzzer target for a bounded time from its kept corpus.
#
#   tests/fuzz/run.sh BUILD/tests/fuzz/fuzz_NAME NAME [LIBFUZZER-ARGS...]
#
# FUZZ_SECONDS (default 20) bounds the run. New inputs that reach new code
# go to a temporary folder, not into tests/fuzz/corpus/NAME/, unless
# FUZZ_KEEP=1: then the kept corpus is merged with them (-merge=1), which
# is how the corpus grows. A crash, a leak or a failed check ends the run;
# the input that did it is kept in BUILD/meson-logs/fuzz-NAME-* and the
# exit status is non-zero. So does anything the target leaves in the
# TMPDIR it is given.

set -u
exe=$1
name=$2
shift 2
: "${TFS_SRC:=$(cd "$(dirname "$0")/../.." && pwd)}"
corpus="$TFS_SRC/tests/fuzz/corpus/$name"
dict="$TFS_SRC/tests/fuzz/$name.dict"
logs="$(dirname "$exe")/../../meson-logs"
work=$(mktemp -d "${TMPDIR:-/tmp}/tfs-fuzz-$name.XXXXXX")
# The target's own TMPDIR: whatever it leaves there fails the run.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tfs-fuzz-tmp-$name.XXXXXX")
trap 'rm -rf "$work" "$tmp"' EXIT

[ -x "$exe" ] || { echo "no fuzz target $exe"; exit 77; }
mkdir -p "$corpus" "$logs"
# -error_exitcode: libFuzzer's own default, 77, is what meson counts as a
# skip, and a crash must fail the test.
args=(-max_total_time="${FUZZ_SECONDS:-20}" -timeout=10 -rss_limit_mb=2048 -error_exitcode=1
	-max_len=4096 -print_final_stats=1 -artifact_prefix="$logs/fuzz-$name-")
[ -f "$dict" ] && args+=(-dict="$dict")

TMPDIR="$tmp" "$exe" "${args[@]}" "$@" "$work" "$corpus"
rc=$?
if [ $rc -eq 0 ] && [ "${FUZZ_KEEP:-0}" = 1 ]; then
	TMPDIR="$tmp" "$exe" -merge=1 "$corpus" "$work" >/dev/null 2>&1 &&
		echo "corpus $corpus: $(ls "$corpus" | wc -l) inputs"
fi
left=$(ls -A "$tmp")
if [ -n "$left" ]; then
	echo "FAIL: $name left in its TMPDIR: $left"
	[ $rc -eq 0 ] && rc=1
fi
exit $rc
