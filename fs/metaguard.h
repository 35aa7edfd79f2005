/*
 * metaguard.h - faults in LMDB's map of a damaged store, as errors.
 *
 * LMDB reads its pages through a memory map. A page past the end of a
 * truncated data.mdb raises SIGBUS when read, and a damaged page can send
 * LMDB's reads elsewhere in the map, or make LMDB follow a bad pointer, or
 * fail one of its own checks (an assertion, which aborts). meta.c checks
 * what it can before the file is mapped (its meta pages, its size); what
 * is left is caught here:
 *
 *   - a fault at an address in a watched map, anywhere;
 *   - a fault in LMDB's code (or in a C library copy that returns into
 *     it), while a store is watched;
 *   - LMDB's failed check (mdb_env_set_assert calls meta_guard_check).
 *
 * Inside meta_guard_run such a fault ends the call with -EUCLEAN: a store
 * opened or checked that way is refused with a message. Elsewhere it is
 * logged and the process exits with status 1: it cannot go on serving
 * from, or writing to, a store it cannot read (a daemon serving a store
 * with garbage pages died by SIGSEGV in mdb_cursor_get from readdir).
 * Any other fault goes on to the handler there was before (a bug still
 * dies by its signal, with a core dump, or in the sanitizer's report).
 */
#ifndef TENSORFS_METAGUARD_H
#define TENSORFS_METAGUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/*
 * Watch LMDB's map of data.mdb (the file dev, ino) of the store in dir,
 * found in /proc/self/maps (LMDB 0.9 does not say where it mapped the
 * file). *addr: the map, to remove it by. 0, or -ENOENT (not mapped, or
 * no /proc), -ENOSPC (too many maps).
 */
int meta_guard_add(dev_t dev, ino_t ino, size_t psize, const char *dir, const void **addr);
void meta_guard_remove(const void *addr);

/* What ended a guarded call. */
enum meta_fault_kind {
	META_FAULT_NONE,
	META_FAULT_MAP,	  /* reading page `page` of a map */
	META_FAULT_CODE,  /* LMDB's code, at `addr` */
	META_FAULT_CHECK, /* LMDB's check, said in `check` */
};

struct meta_fault {
	enum meta_fault_kind kind;
	unsigned long long page;
	const void *addr;
	char check[160];
};

/*
 * fn(arg), with the faults above turned into -EUCLEAN and said in
 * *fault. The code that faulted is abandoned where it was: the caller
 * closes the environment and does nothing more with it.
 */
int meta_guard_run(int (*fn)(void *arg), void *arg, struct meta_fault *fault);
/* For mdb_env_set_assert: LMDB found the pages of the store in dir inconsistent. */
void meta_guard_check(const char *dir, const char *msg);
/*
 * A guarded call that faults abandons what its frames held: a read
 * transaction, a cursor, a buffer. Held here (per thread) from when it is
 * made until it is freed, it stays reachable, so that a leak checker does
 * not report the refusal of a damaged store as a leak. NULL is ignored.
 */
void meta_guard_hold(const void *p);
void meta_guard_release(const void *p);

#endif
