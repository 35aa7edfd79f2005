#!/bin/bash
# The man pages render with no warnings, and `meson install` puts the
# programs, the man pages, the example config and the systemd unit where
# they belong.
# Usage: test_install.sh SOURCE_ROOT BUILD_ROOT
set -u
SRC=$1
BUILD=$2
. "$(dirname "$0")/lib_scratch.sh" install
D=$W

command -v groff >/dev/null || fail "groff is not installed (apt-get install groff)"
n=0
for page in "$SRC"/man/*.[0-9]; do
	out=$(groff -ww -man -z "$page" 2>&1) || fail "groff failed on $page: $out"
	[ -z "$out" ] || fail "$page renders with warnings: $out"
	n=$((n + 1))
done
[ "$n" -ge 4 ] || fail "only $n man pages found"
for p in tensorfs.8 tfsctl.8 tensorfs.conf.5 swapbench.1; do
	[ -f "$SRC/man/$p" ] || fail "man page $p is missing"
done

out=$(meson install --no-rebuild -C "$BUILD" --destdir "$D" 2>&1) || fail "meson install: $out"
prefix=$(meson introspect --buildoptions "$BUILD" |
	python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])')
for f in sbin/tensorfs bin/tfsctl bin/swapbench share/man/man8/tensorfs.8 \
	share/man/man8/tfsctl.8 share/man/man5/tensorfs.conf.5 share/man/man1/swapbench.1; do
	[ -e "$D$prefix/$f" ] || fail "meson install did not install $prefix/$f"
done
find "$D" -name tensorfs.conf.example | grep -q . || fail "no example config installed"
# The systemd unit: its stop waits for the write-back (tfsctl unmount), and
# systemd-analyze finds nothing wrong with an instance of it (run against
# the installed programs).
unit=$D$prefix/lib/systemd/system/tensorfs@.service
[ -f "$unit" ] || fail "meson install did not install $prefix/lib/systemd/system/tensorfs@.service"
grep -qx "ExecStop=$prefix/bin/tfsctl unmount %f" "$unit" ||
	fail "tensorfs@.service does not stop with $prefix/bin/tfsctl unmount: $(grep Exec "$unit")"
if command -v systemd-analyze >/dev/null; then
	mkdir "$D/verify"
	sed "s|=$prefix/\(s*bin\)/|=$D$prefix/\1/|" "$unit" >"$D/verify/tensorfs@.service"
	out=$(cd "$D/verify" && systemd-analyze verify --man=no ./tensorfs@mnt-tfs.service 2>&1) ||
		fail "systemd-analyze verify tensorfs@mnt-tfs.service: $out"
	[ -z "$out" ] || fail "systemd-analyze verify tensorfs@mnt-tfs.service: $out"
fi
"$D$prefix/sbin/tensorfs" --help >/dev/null || fail "the installed tensorfs does not run"
"$D$prefix/bin/tfsctl" --help >/dev/null || fail "the installed tfsctl does not run"
echo "PASS: $n man pages render clean; install puts programs, pages, config and unit in place"
