/*
 * util.c - small helpers shared by the parts of swapbench: the monotonic
 * clock, page-aligned I/O buffers, creating and removing folders, building
 * paths, and error messages on stderr. Calls nothing else of swapbench.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "swapbench.h"

/* Open file descriptors nftw() may hold while removing a tree. */
#define SB_RMTREE_FDS 16

double sb_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleep until the monotonic clock reads @deadline; returns at once if past. */
void sb_sleep_until(double deadline)
{
	struct timespec ts;

	if (deadline <= sb_now())
		return;
	ts.tv_sec = (time_t)deadline;
	ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* A page-aligned buffer, as DeepSpeed's ds_page_aligned_alloc(); NULL on failure. */
void *sb_buf_alloc(uint64_t bytes)
{
	void *p = NULL;

	if (bytes == 0)
		bytes = SB_BUF_ALIGN;
	if (posix_memalign(&p, SB_BUF_ALIGN, sb_align_up(bytes, SB_BUF_ALIGN)))
		return NULL;
	return p;
}

uint64_t sb_align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* mkdir -p: os.makedirs(path, exist_ok=True). */
int sb_mkdirs(const char *path)
{
	char *copy = strdup(path);
	char *p;
	int ret = 0;

	if (!copy)
		return -ENOMEM;
	for (p = copy + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char saved = *p;

		*p = '\0';
		if (mkdir(copy, 0755) && errno != EEXIST) {
			ret = -errno;
			goto cleanup;
		}
		*p = saved;
		if (saved == '\0')
			break;
	}
cleanup:
	free(copy);
	return ret;
}

static int rmtree_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_DP)
		return rmdir(path) ? -1 : 0;
	return unlink(path) ? -1 : 0;
}

/* rm -rf: shutil.rmtree(path, ignore_errors=True), but errors are reported. */
int sb_rmtree(const char *path)
{
	struct stat st;

	if (lstat(path, &st)) {
		if (errno == ENOENT)
			return 0;
		return -errno;
	}
	if (nftw(path, rmtree_one, SB_RMTREE_FDS, FTW_DEPTH | FTW_PHYS))
		return errno ? -errno : -EIO;
	return 0;
}

/* A path built with printf formatting; NULL when out of memory. */
char *sb_path(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : s;
}

void sb_err(const char *fmt, ...)
{
	char line[4096];
	va_list ap;
	int n;

	n = snprintf(line, sizeof(line), "swapbench: ");
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	strcat(line, "\n");
	/* One write per message, so that lines of concurrent ranks do not mix. */
	if (write(STDERR_FILENO, line, strlen(line)) < 0)
		return;
}
