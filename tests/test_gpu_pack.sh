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
# As root, `run all` (the whole GPU check) with each step bounded to 5 s
# and a python3 that never ends first on PATH: every step runs, in order,
# whatever the ones before did (here the GPU steps fail or skip and the
# offload steps time out); summary.md names each step's result; no mount
# is left behind; it exits non-zero.
# Usage: test_gpu_pack.sh SOURCE_ROOT BUILD_ROOT
set -u
SRC=$1
BUILD=$2
. "$(dirname "$0")/lib_scratch.sh" gpupack
D=$W

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
if [ "$(id -u)" -eq 0 ] && [ -c /dev/fuse ]; then
	mkdir -p "$D/slow"
	printf '#!/bin/sh\nexec sleep 600\n' >"$D/slow/python3"
	chmod +x "$D/slow/python3"
	t0=$(date +%s)
	(cd "$SRC" && PATH="$D/slow:$PATH" GPU_DRAM=256M "$D/pack/run" all -T 5 -o "$D/all" \
		>"$D/all.out" 2>&1)
	all_rc=$?
	[ $all_rc -ne 0 ] || fail "run all exited 0 with steps that failed"
	[ $(($(date +%s) - t0)) -lt 120 ] || fail "run all took $(($(date +%s) - t0)) s with 5 s steps"
	[ -s "$D/all/summary.md" ] && [ -s "$D/all/log.txt" ] ||
		fail "run all wrote no summary.md or log.txt: $(tail -n 5 "$D/all.out")"
	steps=$(awk -F' [|] ' '/^[|] [a-z]/ { sub(/^[|] /, "", $1); if ($1 != "step") print $1 }' \
		"$D/all/summary.md" | tr '\n' ' ')
	[ "$steps" = "test gpubench gpubench-fallback offload-2048 offload-4096 gpubench-nvme " ] ||
		fail "run all's steps: $steps"
	grep -qE '^[|] offload-2048 [|] timed out after 5 s [|]' "$D/all/summary.md" ||
		fail "run all: offload-2048 did not time out: $(grep offload-2048 "$D/all/summary.md")"
	grep -qE '^[|] gpubench-nvme [|] (pass|skip|failed|timed out)' "$D/all/summary.md" ||
		fail "run all: the step after the timeouts did not run"
	grep -E "/tmp/tfs-(gpubench|offload)\." /proc/mounts && fail "run all left a mount behind"
fi
echo "PASS: gpu-pack ($(ls "$D/pack" | wc -l) files; run test exited $rc)"
