#!/bin/bash
# The Debian package, built from a copy of the source with
# `dpkg-buildpackage -us -uc -b` (without running the tests again):
# tensorfs holds the daemon, tfsctl, swapbench, their manual pages, the
# example configuration and the systemd unit of a mount, and they run from
# the unpacked package; where the CUDA toolkit is, libtensorfs-cuda0 holds
# the library and libtensorfs-cuda-dev its header, link, pkg-config file
# and manual page.
# Nothing names the build machine's folders, and lintian reports no error
# or warning. The docs are the current ones: the plots shipped are exactly
# those docs/benchmarks.md links. Nothing is installed on this machine.
# Usage: test_deb.sh SOURCE_ROOT
# Exit: 0 pass, 1 fail, 77 skip (no dpkg-buildpackage, dh or lintian).
set -u
SRC=$1
W=$(mktemp -d "${TMPDIR:-/var/tmp}/tfs-deb.XXXXXX")
trap 'rm -rf "$W"' EXIT
fail() {
	echo "FAIL: $*" >&2
	[ -s "$W/build.log" ] && tail -n 40 "$W/build.log" >&2
	exit 1
}

for tool in dpkg-buildpackage dpkg-checkbuilddeps dh lintian; do
	command -v $tool >/dev/null || { echo "SKIP: no $tool (apt-get install debhelper lintian)"; exit 77; }
done

# A copy of the source as git knows it: no build folders, no test servers.
mkdir "$W/tensorfs"
if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	git -C "$SRC" ls-files -z --cached --others --exclude-standard |
		grep -zv '^tests/node_modules' | (cd "$SRC" && tar --null -T - -cf -) |
		tar -xf - -C "$W/tensorfs" || fail "copying the source"
else
	tar -C "$SRC" --exclude='./build*' --exclude=./tests/node_modules --exclude='./obj-*' \
		-cf - . | tar -xf - -C "$W/tensorfs" || fail "copying the source"
fi
cd "$W/tensorfs" || fail "cd"

# libtensorfs-cuda needs the CUDA toolkit: Debian's nvidia-cuda-toolkit, or
# NVIDIA's own in /usr/local/cuda, which dpkg does not know (then every
# other build dependency is checked here, and the build told not to).
args=()
cuda=1
if dpkg-checkbuilddeps >/dev/null 2>&1; then
	:
elif dpkg-checkbuilddeps -P pkg.tensorfs.nocuda 2>"$W/deps.err"; then
	if [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
		args=(-d)
	else
		args=(-Ppkg.tensorfs.nocuda)
		cuda=0
	fi
else
	fail "build dependencies missing: $(cat "$W/deps.err")"
fi

start=$SECONDS
DEB_BUILD_OPTIONS="nocheck parallel=2" dpkg-buildpackage -us -uc -b "${args[@]}" \
	>"$W/build.log" 2>&1 || fail "dpkg-buildpackage ${args[*]} failed"
echo "built in $((SECONDS - start)) s (${args[*]:-all build dependencies from dpkg})"

deb() { ls "$W"/"$1"_*.deb 2>/dev/null | head -n 1; }
# has DEB PATH...: the package holds each path.
has() {
	local d=$1 p
	shift
	dpkg-deb -c "$d" | awk '{ print $6 }' | sed 's|^\./|/|' >"$W/list" || fail "dpkg-deb -c $d"
	for p in "$@"; do
		grep -qx -- "$p" "$W/list" || fail "$(basename "$d") lacks $p: $(cat "$W/list")"
	done
}
# clean DEB: no path of the build machine in any of its files.
clean() {
	rm -rf "$W/x" && dpkg-deb -x "$1" "$W/x" || fail "dpkg-deb -x $1"
	if grep -rlE '/usr/local/|/work/|tfs-deb\.' "$W/x" --include='*.pc' --include='*.h' \
		--include='*.example' >"$W/dirty"; then
		fail "$(basename "$1") names the build machine's folders: $(cat "$W/dirty")"
	fi
}

T=$(deb tensorfs)
[ -n "$T" ] || fail "no tensorfs package: $(ls "$W")"
has "$T" /usr/sbin/tensorfs /usr/bin/tfsctl /usr/bin/swapbench \
	/usr/share/man/man8/tensorfs.8.gz /usr/share/man/man8/tfsctl.8.gz \
	/usr/share/man/man5/tensorfs.conf.5.gz /usr/share/man/man1/swapbench.1.gz \
	/usr/share/doc/tensorfs/examples/tensorfs.conf.example /usr/share/doc/tensorfs/copyright \
	/usr/share/doc/tensorfs/examples/tensorfs.json /usr/share/doc/tensorfs/plots/swap-dram-matrix.svg \
	/usr/lib/systemd/system/tensorfs@.service
grep -qE '^/(etc|usr/local)/' "$W/list" && fail "tensorfs installs into /etc or /usr/local: $(cat "$W/list")"
grep -qE '/bin/gpubench' "$W/list" && fail "tensorfs ships gpubench" # (a plot may be named after it)
dpkg-deb -f "$T" Depends | grep -q 'fuse3' || fail "tensorfs does not depend on fuse3"
dpkg-deb -f "$T" Depends | grep -q 'libfuse3' || fail "tensorfs lacks its library dependencies"
clean "$T"
grep -qx 'ExecStop=/usr/bin/tfsctl unmount %f' "$W/x/usr/lib/systemd/system/tensorfs@.service" ||
	fail "the packaged tensorfs@.service does not stop with /usr/bin/tfsctl unmount"
# Only current docs: each plot shipped is linked from the shipped
# benchmarks.md, and each plot it links is shipped.
doc=$W/x/usr/share/doc/tensorfs
{ zcat "$doc/benchmarks.md.gz" 2>/dev/null || cat "$doc/benchmarks.md"; } >"$W/bench.md" ||
	fail "tensorfs ships no benchmarks.md"
grep -o '](plots/[^)]*)' "$W/bench.md" | sed 's|^](plots/||; s|)$||' | sort -u >"$W/linked"
(cd "$doc/plots" && ls) | sort >"$W/shipped"
[ -s "$W/linked" ] || fail "the shipped benchmarks.md links no plot"
cmp -s "$W/linked" "$W/shipped" ||
	fail "the plots shipped are not those benchmarks.md links: $(diff "$W/linked" "$W/shipped")"
"$W/x/usr/sbin/tensorfs" --help >/dev/null 2>&1 || fail "the packaged tensorfs does not run"
"$W/x/usr/bin/tfsctl" --version >/dev/null 2>&1 || fail "the packaged tfsctl does not run"
"$W/x/usr/bin/swapbench" --help >/dev/null 2>&1 || fail "the packaged swapbench does not run"

if [ $cuda -eq 1 ]; then
	L=$(deb libtensorfs-cuda0) D=$(deb libtensorfs-cuda-dev)
	[ -n "$L" ] && [ -n "$D" ] || fail "no libtensorfs-cuda packages: $(ls "$W")"
	multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
	has "$L" "/usr/lib/$multiarch/libtensorfs-cuda.so.0" "/usr/lib/$multiarch/libtensorfs-cuda.so.0.1.0"
	has "$D" /usr/include/tensorfs_cuda.h "/usr/lib/$multiarch/libtensorfs-cuda.so" \
		"/usr/lib/$multiarch/pkgconfig/tensorfs-cuda.pc" /usr/share/man/man3/tensorfs-cuda.3.gz \
		/usr/share/doc/libtensorfs-cuda-dev/examples/tensorfs_offload.py \
		/usr/share/doc/libtensorfs-cuda-dev/examples/offload_demo.py
	dpkg-deb -f "$D" Depends | grep -q 'libtensorfs-cuda0 (= ' ||
		fail "libtensorfs-cuda-dev does not depend on its library's version"
	clean "$D"
else
	[ -z "$(deb libtensorfs-cuda0)" ] || fail "libtensorfs-cuda0 built without CUDA"
	echo "no CUDA toolkit: built tensorfs alone (profile pkg.tensorfs.nocuda)"
fi

lintian --fail-on error,warning "$W"/tensorfs_*.changes >"$W/lintian.out" 2>&1 ||
	fail "lintian: $(grep -v 'root privileges' "$W/lintian.out")"
grep -E '^[EW]: ' "$W/lintian.out" && fail "lintian reported the above"
echo "PASS: the Debian packages build, hold what they must, and pass lintian"
