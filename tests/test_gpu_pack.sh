#!/bin/bash
# tools/gpu-pack packs a build for a GPU machine without its libraries: the
# programs and every library they link but the C library's, and a driver.
# Checked here without a GPU: the pack holds the programs, libfuse3,
# liburing, LMDB and libcurl, and every library the daemon and gpubench
# link but the C library's own; the packed daemon runs from the pack's
# driver; `run test` skips (77) where there is no GPU, as the GPU test
# does (on a GPU machine it runs it). With -f the pack holds fio and its
# libraries, `run` puts that fio first on PATH, and `run bench` (as root)
# runs tools/bench's swap matrix on a mount of the packed daemon.
# Usage: test_gpu_pack.sh SOURCE_ROOT BUILD_ROOT
set -u
SRC=$1
BUILD=$2
D=$(mktemp -d "${TMPDIR:-/var/tmp}/tfs-gpupack.XXXXXX")
trap 'rm -rf "$D"' EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

[ -x "$BUILD/tools/gpubench/gpubench" ] || { echo "SKIP: built without CUDA"; exit 77; }
FIO=
command -v fio >/dev/null && FIO=-f
"$SRC/tools/gpu-pack" -b "$BUILD" $FIO "$D/pack" >"$D/out" 2>&1 || fail "gpu-pack: $(cat "$D/out")"
for f in tensorfs tfsctl swapbench gpubench gpu_roundtrip run libtensorfs-cuda.so.0; do
	[ -e "$D/pack/$f" ] || fail "the pack lacks $f"
done
for l in libfuse3.so.3 liburing.so.2 liblmdb.so.0 libcurl.so.4; do
	[ -e "$D/pack/$l" ] || fail "the pack lacks $l"
done
ls "$D/pack" | grep -qE '^(libc\.so|ld-linux)' && fail "the pack holds the C library"
for p in "$BUILD/fs/tensorfs" "$BUILD/tools/gpubench/gpubench"; do
	for l in $(ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'); do
		case $(basename "$l") in
		libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
		libtensorfs-cuda*) ;;
		*) [ -e "$D/pack/$(basename "$l")" ] || fail "the pack lacks $(basename "$l") of $p" ;;
		esac
	done
done
out=$(cd "$SRC" && "$D/pack/run" shell tensorfs --version 2>&1) || fail "the packed daemon: $out"
case $out in *tensorfs*) ;; *) fail "the packed daemon's --version said: $out" ;; esac
(cd "$SRC" && "$D/pack/run" test >"$D/test.out" 2>&1)
rc=$?
[ $rc -eq 77 ] || [ $rc -eq 0 ] || fail "run test exited $rc: $(tail -n 5 "$D/test.out")"
if [ -n "$FIO" ]; then
	[ -x "$D/pack/fio/fio" ] || fail "gpu-pack -f: the pack lacks fio"
	[ -e "$D/pack/fio/libaio.so.1" ] || fail "gpu-pack -f: the pack lacks fio's libaio"
	out=$(cd "$SRC" && "$D/pack/run" shell sh -c 'command -v fio; fio --version' 2>&1) ||
		fail "the packed fio: $out"
	case $out in /usr/* | /bin/*) fail "run put the machine's fio first: $out" ;; esac
	case $out in *fio-*) ;; *) fail "the packed fio's --version said: $out" ;; esac
	if [ "$(id -u)" -eq 0 ]; then
		mkdir "$D/bench"
		(cd "$SRC" && "$D/pack/run" bench swap --targets tfs --params 4e6 --sub-group-size 2e6 \
			--iters 2 --swap-dram 128M --dir "$D/bench" >"$D/bench.out" 2>&1) ||
			fail "run bench: $(tail -n 5 "$D/bench.out")"
		grep -qE '^\| tfs \| [0-9]+\.[0-9]+ \|' "$D/bench.out" ||
			fail "run bench gave no tfs row: $(tail -n 5 "$D/bench.out")"
	fi
fi
echo "PASS: gpu-pack ($(ls "$D/pack" | wc -l) files; run test exited $rc)"
