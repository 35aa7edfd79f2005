/*
 * log.c - the daemon's log.
 *
 * Each line is formatted whole and written with one write(2), so lines
 * from concurrent threads never interleave.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static enum log_level log_level = LOG_LVL_INFO;
static int log_fd = STDERR_FILENO;
static const char *const level_names[] = {"error", "warning", "info", "debug"};

void log_set_level(enum log_level lvl)
{
	log_level = lvl;
}

void log_set_fd(int fd)
{
	log_fd = fd;
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	char line[1024];
	int n;
	va_list ap;

	if (lvl > log_level)
		return;
	n = snprintf(line, sizeof(line), "tensorfs: %s: ", level_names[lvl]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(log_fd, line, (size_t)n) < 0)
		return;
}

bool log_ratelimit(long *last_sec, unsigned interval_sec)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	if (*last_sec && ts.tv_sec - *last_sec < (long)interval_sec)
		return false;
	*last_sec = ts.tv_sec;
	return true;
}
