/*
 * fault.h - fault injection for tests: make the devices of the persistent
 * tiers fail, or stall, a chosen share of their reads, writes and syncs.
 *
 * Compiled in only by a build configured with -Dfault_injection=true,
 * which defines TFS_FAULT_INJECTION; elsewhere the hooks below are empty
 * and the daemon ignores the variables. In the spirit of SQLite's I/O error
 * tests, rules come from the environment of the daemon:
 *
 *   TENSORFS_FAULT="RULE[;RULE...]"  read once, when the first device opens
 *   TENSORFS_FAULT_FILE=PATH         the rules in a file, read again whenever
 *                                    the file changes (so a test can turn
 *                                    faults on and off on a live mount)
 *
 * A rule is a comma-separated list of key=value:
 *
 *   dev=NAME    nvme0, nvme1, ..., s3, pfs, or * (default: every device)
 *   op=OP       read, write, sync or any (default any); flusher: each turn
 *               of the cache's flusher, in its gap between looking for work
 *               and sleeping (dev=flusher), where err=delay widens that
 *               window for a test of the wake-ups it could lose; prefetch:
 *               each block the owner asks the cache to load ahead
 *               (tb_prefetch, dev=prefetch), where err=delay stretches a
 *               prefetch turn for a test of what may run beside it
 *   err=E       EIO, ENOSPC, ETIMEDOUT: the request fails with it, before
 *               the medium sees it; delay: it waits ms= milliseconds, then
 *               runs; 503: (s3) an attempt is answered as by an overloaded
 *               server, which the s3 engine retries
 *   rate=P      probability per request, 0 to 1 (default 1)
 *   after=N     let the first N matching requests through (default 0)
 *   count=N     inject at most N times, 0: no limit (default 0)
 *   ms=N        the delay of err=delay (default 100)
 *   seed=N      seed of this rule's random choices (default 1)
 *
 * In a file, rules may also be one per line; '#' starts a comment. Each
 * injection is logged as one line starting with "fault injected:".
 */
#ifndef TENSORFS_FAULT_H
#define TENSORFS_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a device asks. */
enum fault_point {
	FAULT_READ,	  /* a read request, before it is started */
	FAULT_WRITE,	  /* a write request, before it is started */
	FAULT_SYNC,	  /* a device flush (fdatasync) */
	FAULT_S3_ATTEMPT, /* one HTTP attempt of an s3 request, after it ended */
	FAULT_FLUSHER,	  /* each turn of the cache's flusher, the store unlocked */
	FAULT_PREFETCH,	  /* each tb_prefetch call, before it looks at the cache */
};

#ifdef TFS_FAULT_INJECTION

/* Read TENSORFS_FAULT once; -EINVAL (logged) when a rule does not parse. */
int fault_init(void);
/*
 * 0: go on (after the delay a rule asked for); -errno: fail the request
 * with it; at FAULT_S3_ATTEMPT, -EAGAIN: treat the attempt as a 503.
 */
int fault_inject(const char *dev, enum fault_point at, uint64_t slot);
/* Parse rules without installing them: for the unit test. */
int fault_parse(const char *spec, char *err, size_t errlen);

#else

static inline int fault_init(void)
{
	return 0;
}

static inline int fault_inject(const char *dev, enum fault_point at, uint64_t slot)
{
	(void)dev;
	(void)at;
	(void)slot;
	return 0;
}

#endif

#endif
