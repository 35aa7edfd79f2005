/*
 * copy_cpu.c - the copy engine of the protocol tests: memcpy.
 *
 * Linked instead of copy_cuda.c into the tests that check the shared-arena
 * protocol and the library's batching on machines without a GPU. The
 * "device" pointer is host memory; every copy is done when it returns.
 */
#include "client.h"
#include "copy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define HOST_ALIGN 4096

const char tfsc_copy_engine[] = "cpu";

/*
 * Test hook: the copy after this many more fails with -EIO, so that the
 * tests reach the library's error paths (a failed copy of a pinned batch).
 * Negative: never.
 */
int tfsc_copy_fail_after = -1;

static int maybe_fail(void)
{
	if (tfsc_copy_fail_after < 0 || tfsc_copy_fail_after-- > 0)
		return 0;
	return tfsc_fail(-EIO, "copy failed (test hook)");
}

int tfsc_copy_check(const void *p, size_t len)
{
	(void)p;
	(void)len;
	return 0;
}

int tfsc_copy_register(void *host, size_t len, bool *done)
{
	(void)host;
	(void)len;
	*done = false;
	return 0;
}

void tfsc_copy_unregister(void *host)
{
	(void)host;
}

int tfsc_copy_h2d(void *dev, const void *host, size_t n, void *stream)
{
	(void)stream;
	if (maybe_fail())
		return -EIO;
	memcpy(dev, host, n);
	return 0;
}

int tfsc_copy_d2h(void *host, const void *dev, size_t n, void *stream)
{
	(void)stream;
	if (maybe_fail())
		return -EIO;
	memcpy(host, dev, n);
	return 0;
}

int tfsc_copy_zero(void *dev, size_t n, void *stream)
{
	(void)stream;
	if (maybe_fail())
		return -EIO;
	memset(dev, 0, n);
	return 0;
}

int tfsc_copy_sync(void *stream)
{
	(void)stream;
	return 0;
}

void *tfsc_copy_host_alloc(size_t n)
{
	return aligned_alloc(HOST_ALIGN, (n + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN);
}

void tfsc_copy_host_free(void *p)
{
	free(p);
}
