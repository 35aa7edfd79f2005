/*
 * metaguard.c - faults in LMDB's map of a damaged store, as errors.
 *
 * One handler for SIGBUS and SIGSEGV, installed with the first map
 * watched. It looks the faulting address up among the watched maps, and
 * the faulting instruction among LMDB's code (found once, in
 * /proc/self/maps, by the library that holds mdb_cursor_get), or among
 * the C library's when the copy that faulted returns into LMDB (a damaged
 * page's pointer handed to memcpy: tfsctl fsck died so in mount-damaged,
 * 3 runs in 9), then does
 * what metaguard.h says. To pass a fault on, it puts back the handler
 * there was before and returns: the instruction faults again under it
 * (a signal that was sent, not a fault, is raised again).
 */
#include "metaguard.h"
#include "log.h"

#include <dlfcn.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <ucontext.h>
#include <unistd.h>

#define GUARD_MAPS 8 /* stores open at once in one process */
#define CODE_RANGES 4
#define HELD_MAX 16 /* objects one guarded call holds at once */

/* The watched maps; the handler reads them, meta_guard_add and _remove change them under lock. */
static struct guard_map {
	uintptr_t addr; /* 0: a free entry */
	size_t len, psize;
	char dir[512];
} maps[GUARD_MAPS];
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static struct sigaction old_bus, old_segv;
/* LMDB's code, and the C library's (memcpy), set once before the handler is installed. */
struct code_range {
	uintptr_t start, end;
};
static struct code_range code[CODE_RANGES], libc_code[CODE_RANGES];

/* The guarded call on this thread, if any, what ended it, and what it holds. */
static __thread sigjmp_buf *guard_jmp;
static __thread struct meta_fault guard_fault;
static __thread const void *held[HELD_MAX];

static const struct guard_map *find_map(uintptr_t a)
{
	for (int i = 0; i < GUARD_MAPS; i++) {
		uintptr_t base = __atomic_load_n(&maps[i].addr, __ATOMIC_ACQUIRE);

		if (base && a >= base && a - base < maps[i].len)
			return &maps[i];
	}
	return NULL;
}

/* The faulting instruction, where this machine's context says. */
static uintptr_t fault_pc(const void *ctx)
{
	const ucontext_t *uc = ctx;

#if defined(__x86_64__)
	return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
	return (uintptr_t)uc->uc_mcontext.pc;
#else
	(void)uc;
	return 0;
#endif
}

static bool in_ranges(const struct code_range *r, uintptr_t pc)
{
	for (int i = 0; i < CODE_RANGES; i++)
		if (pc && pc >= r[i].start && pc < r[i].end)
			return true;
	return false;
}

static bool in_lmdb(uintptr_t pc)
{
	return in_ranges(code, pc);
}

/*
 * Where a fault in the C library returns to, if the function is a leaf
 * that has pushed nothing (memcpy, memmove, memcmp, as LMDB calls them
 * with a pointer it read from a damaged page): the word at the stack
 * pointer on x86-64, the link register on arm64. 0 where unknown.
 */
static uintptr_t leaf_caller(const void *ctx)
{
	const ucontext_t *uc = ctx;

#if defined(__x86_64__)
	return *(const uintptr_t *)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
	return (uintptr_t)uc->uc_mcontext.regs[30];
#else
	(void)uc;
	return 0;
#endif
}

/* The fault is LMDB's: in its code, or in a C library copy it called. */
static bool lmdb_fault(uintptr_t pc, const void *ctx)
{
	return in_lmdb(pc) || (in_ranges(libc_code, pc) && in_lmdb(leaf_caller(ctx)));
}

static void pass_on(int sig, const siginfo_t *si)
{
	sigaction(sig, sig == SIGBUS ? &old_bus : &old_segv, NULL);
	if (si->si_code <= 0)
		raise(sig);
}

/*
 * log_err is not async-signal-safe: it formats and takes the rate
 * limiter's lock. The fault is in LMDB's code, which holds neither, and
 * the process ends right after: the message is worth that.
 */
static void on_fault(int sig, siginfo_t *si, void *ctx)
{
	bool fault = si->si_code > 0;
	const struct guard_map *g = fault ? find_map((uintptr_t)si->si_addr) : NULL;
	uintptr_t pc = fault ? fault_pc(ctx) : 0;
	bool lmdb = fault && lmdb_fault(pc, ctx);

	if (guard_jmp && (g || lmdb)) {
		memset(&guard_fault, 0, sizeof(guard_fault));
		guard_fault.kind = g ? META_FAULT_MAP : META_FAULT_CODE;
		guard_fault.page = g ? ((uintptr_t)si->si_addr - g->addr) / g->psize : 0;
		guard_fault.addr = si->si_addr;
		siglongjmp(*guard_jmp, 1);
	}
	if (g) {
		log_err("meta folder %s: data.mdb is damaged: reading its page %llu failed (%s); "
			"stopping rather than go on with a store that cannot be read: check it "
			"with tfsctl fsck",
			g->dir, (unsigned long long)(((uintptr_t)si->si_addr - g->addr) / g->psize),
			sig == SIGBUS ? "past the end of the file" : "a bad address");
		_exit(1);
	}
	if (lmdb) {
		/*
		 * A store is watched and LMDB faulted outside a guarded call:
		 * a damaged page it read while serving. Stopped as a fault in
		 * the map is, with a message, not a signal.
		 */
		log_err("LMDB's code faulted at address %p: data.mdb is probably damaged; stopping "
			"rather than go on with a store that cannot be read: check it with tfsctl "
			"fsck",
			si->si_addr);
		_exit(1);
	}
	pass_on(sig, si);
}

/*
 * The executable mappings of the library that holds sym into r, unless it
 * is linked into the program itself.
 */
static void find_code(void *sym, struct code_range *r)
{
	char exe[4096], line[4096];
	Dl_info info;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	FILE *f;
	int i = 0;

	if (!dladdr(sym, &info) || !info.dli_fname || n <= 0)
		return;
	exe[n] = 0;
	if (strcmp(info.dli_fname, exe) == 0 || !(f = fopen("/proc/self/maps", "re")))
		return;
	while (i < CODE_RANGES && fgets(line, sizeof(line), f)) {
		unsigned long long start, end;
		char perms[8], *path = strchr(line, '/');

		if (!path || sscanf(line, "%llx-%llx %7s", &start, &end, perms) != 3 ||
		    !strchr(perms, 'x'))
			continue;
		path[strcspn(path, "\n")] = 0;
		if (strcmp(path, info.dli_fname) != 0) {
			/* dli_fname may be the name it was loaded by: compare the files. */
			char real[4096];

			if (!realpath(info.dli_fname, real) || strcmp(path, real) != 0)
				continue;
		}
		r[i].start = (uintptr_t)start;
		r[i].end = (uintptr_t)end;
		i++;
	}
	fclose(f);
}

static void install(void)
{
	struct sigaction sa;

	find_code((void *)mdb_cursor_get, code);
	find_code((void *)memcpy, libc_code);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &old_bus);
	sigaction(SIGSEGV, &sa, &old_segv);
}

/* The map of file (dev, ino) in /proc/self/maps: 0 with its start and length, or -ENOENT. */
static int find_file_map(dev_t dev, ino_t ino, uintptr_t *addr, size_t *len)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[4096];
	int ret = -ENOENT;

	if (!f)
		return -ENOENT;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long start, end, off, inode;
		unsigned maj, min;

		if (sscanf(line, "%llx-%llx %*s %llx %x:%x %llu", &start, &end, &off, &maj, &min,
			   &inode) != 6 ||
		    inode != (unsigned long long)ino || maj != major(dev) || min != minor(dev) ||
		    off != 0)
			continue;
		/* The largest: LMDB maps the whole map size at once. */
		if (ret == 0 && end - start <= *len)
			continue;
		*addr = (uintptr_t)start;
		*len = (size_t)(end - start);
		ret = 0;
	}
	fclose(f);
	return ret;
}

int meta_guard_add(dev_t dev, ino_t ino, size_t psize, const char *dir, const void **addr)
{
	uintptr_t start;
	size_t len;
	int ret = find_file_map(dev, ino, &start, &len);

	*addr = NULL;
	if (ret)
		return ret;
	pthread_once(&install_once, install);
	ret = -ENOSPC;
	pthread_mutex_lock(&maps_lock);
	for (int i = 0; i < GUARD_MAPS; i++) {
		if (maps[i].addr)
			continue;
		maps[i].len = len;
		maps[i].psize = psize ? psize : 1;
		snprintf(maps[i].dir, sizeof(maps[i].dir), "%s", dir);
		__atomic_store_n(&maps[i].addr, start, __ATOMIC_RELEASE);
		*addr = (const void *)start;
		ret = 0;
		break;
	}
	pthread_mutex_unlock(&maps_lock);
	return ret;
}

void meta_guard_remove(const void *addr)
{
	pthread_mutex_lock(&maps_lock);
	for (int i = 0; i < GUARD_MAPS; i++)
		if (addr && maps[i].addr == (uintptr_t)addr)
			__atomic_store_n(&maps[i].addr, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&maps_lock);
}

void meta_guard_check(const char *dir, const char *msg)
{
	if (guard_jmp) {
		memset(&guard_fault, 0, sizeof(guard_fault));
		guard_fault.kind = META_FAULT_CHECK;
		snprintf(guard_fault.check, sizeof(guard_fault.check), "%s", msg);
		siglongjmp(*guard_jmp, 1);
	}
	log_err("meta folder %s: data.mdb is damaged: LMDB found its pages inconsistent (%s); "
		"stopping rather than go on with a store that cannot be read: check it with "
		"tfsctl fsck",
		dir ? dir : "?", msg);
	_exit(1);
}

void meta_guard_hold(const void *p)
{
	for (int i = 0; p && i < HELD_MAX; i++) {
		if (!held[i]) {
			held[i] = p;
			return;
		}
	}
}

void meta_guard_release(const void *p)
{
	for (int i = 0; p && i < HELD_MAX; i++) {
		if (held[i] == p) {
			held[i] = NULL;
			return;
		}
	}
}

int meta_guard_run(int (*fn)(void *arg), void *arg, struct meta_fault *fault)
{
	sigjmp_buf jb, *outer = guard_jmp;
	int ret;

	if (fault)
		fault->kind = META_FAULT_NONE;
	if (sigsetjmp(jb, 1)) {
		guard_jmp = outer;
		if (fault)
			*fault = guard_fault;
		return -EUCLEAN;
	}
	guard_jmp = &jb;
	ret = fn(arg);
	guard_jmp = outer;
	return ret;
}
