"""passthrough.py: libfuse's passthrough_ll example, the FUSE floor.

The fio and swap matrices can measure libfuse's own passthrough_ll over a
raw folder: what FUSE alone costs. build_passthrough compiles the example
that libfuse3-dev ships, with one aligned copy per write added ahead of it
(ALIGNED_WRITE_SHIM), into build-bench/.
"""

import os
import re
import sys

from .runner import REPO, log, run_capture


def build_passthrough(bench):
    """Build libfuse's passthrough_ll example into build-bench/."""
    src = "/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c"
    if not os.path.exists(src):
        log("%s missing (apt-get install libfuse3-dev)" % src)
        return None
    outdir = os.path.join(REPO, "build-bench")
    os.makedirs(outdir, exist_ok=True)
    with open(src) as f:
        m = re.search(r"^#define\s+FUSE_USE_VERSION\s+(\d+)", f.read(),
                      re.M)
    version = m.group(1) if m else "34"
    shim = os.path.join(outdir, "aligned_write.h")
    with open(shim, "w") as f:
        f.write(ALIGNED_WRITE_SHIM.replace("@FUSE_USE_VERSION@", version))
    exe = os.path.join(outdir, "passthrough_ll")
    flags = run_capture(["pkg-config", "--cflags", "--libs", "fuse3"])
    if flags is None or flags.returncode != 0:
        log("pkg-config fuse3 failed (apt-get install libfuse3-dev)")
        return None
    cc = os.environ.get("CC", "cc")
    cmd = ([cc, "-O2", "-include", shim, "-I", os.path.dirname(src),
            "-o", exe, src] + flags.stdout.split())
    r = run_capture(cmd)
    if r is None or r.returncode != 0:
        log("building passthrough_ll failed: %s" % " ".join(cmd))
        if r is not None:
            sys.stderr.write(r.stderr)
        return None
    return exe


ALIGNED_WRITE_SHIM = r"""/*
 * Included ahead of libfuse's passthrough_ll.c by tools/bench.
 *
 * libfuse hands lo_write_buf() the request's data at an address that is not
 * page aligned; passthrough_ll writes it to the backing file opened with the
 * caller's flags, and O_DIRECT on ext4/xfs then fails with EINVAL. Copy such
 * data once into an aligned per-thread buffer before the write.
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION @FUSE_USE_VERSION@
#include <fuse_lowlevel.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_ALIGN 4096

static ssize_t bench_aligned_buf_copy(struct fuse_bufvec *dst,
				      struct fuse_bufvec *src,
				      enum fuse_buf_copy_flags flags)
{
	static __thread void *bounce;
	static __thread size_t bounce_size;
	size_t len = fuse_buf_size(src);
	struct fuse_bufvec tmp = FUSE_BUFVEC_INIT(len);

	if (src->count != 1 || src->idx != 0 ||
	    (src->buf[0].flags & FUSE_BUF_IS_FD) ||
	    ((uintptr_t)src->buf[0].mem + src->off) % BENCH_ALIGN == 0)
		return fuse_buf_copy(dst, src, flags);
	if (bounce_size < len) {
		free(bounce);
		bounce = NULL;
		bounce_size = 0;
		if (posix_memalign(&bounce, BENCH_ALIGN, len) != 0)
			return -ENOMEM;
		bounce_size = len;
	}
	memcpy(bounce, (const char *)src->buf[0].mem + src->off, len);
	tmp.buf[0].mem = bounce;
	return fuse_buf_copy(dst, &tmp, flags);
}
#define fuse_buf_copy bench_aligned_buf_copy
"""
