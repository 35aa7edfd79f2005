/*
 * log.c - the daemon's log.
 *
 * Each line is formatted whole and written with one write(2), so lines
 * from concurrent threads never interleave; with log_use_syslog the lines
 * go to syslog(3) instead, at the matching priority.
 *
 * Errors and warnings are rate limited per message format: at most
 * BURST lines of one format per second. What is held back is counted and
 * said on the next line of that format that gets through.
 *
 * Lines name files, folders and values that users chose: what the format
 * filled in is escaped (escape.h), so that a name cannot start a line of
 * its own or send a terminal escape to whoever reads the log.
 */
#include "log.h"
#include "escape.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define BURST 5
#define RL_SLOTS 64

static enum log_level log_level = LOG_LVL_INFO;
static int log_fd = STDERR_FILENO;
static bool log_syslog;
static const char *const level_names[] = {"error", "warning", "info", "debug"};
static const int level_prio[] = {LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG};

static struct {
	const char *fmt; /* the call site's format string, by address */
	long sec;
	unsigned lines, held;
} rl[RL_SLOTS];
static pthread_mutex_t rl_lock = PTHREAD_MUTEX_INITIALIZER;

void log_set_level(enum log_level lvl)
{
	log_level = lvl;
}

void log_set_fd(int fd)
{
	log_fd = fd;
}

void log_use_syslog(void)
{
	openlog("tensorfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
	log_syslog = true;
}

static long now_sec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec;
}

/* Whether a line of fmt may go out now; *held: lines held back before it. */
static bool rl_pass(const char *fmt, unsigned *held)
{
	uintptr_t h = (uintptr_t)fmt;
	unsigned i = (unsigned)((h >> 4) ^ (h >> 12)) % RL_SLOTS;
	long sec = now_sec();
	bool pass;

	*held = 0;
	pthread_mutex_lock(&rl_lock);
	if (rl[i].fmt != fmt || rl[i].sec != sec) {
		if (rl[i].fmt == fmt)
			*held = rl[i].held;
		else
			rl[i].fmt = fmt;
		rl[i].sec = sec;
		rl[i].lines = 0;
		rl[i].held = 0;
	}
	pass = rl[i].lines < BURST;
	if (pass)
		rl[i].lines++;
	else
		rl[i].held++;
	pthread_mutex_unlock(&rl_lock);
	return pass;
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	char msg[1024], line[ESC_SIZE(sizeof(msg))];
	unsigned held = 0;
	int n = 0, m;
	va_list ap;

	if (lvl > log_level)
		return;
	if (lvl <= LOG_LVL_WARN && !rl_pass(fmt, &held))
		return;
	if (!log_syslog)
		n = snprintf(line, sizeof(line), "tensorfs: %s: ", level_names[lvl]);
	va_start(ap, fmt);
	m = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (m > (int)sizeof(msg) - 1)
		m = (int)sizeof(msg) - 1;
	n += (int)esc_bytes(msg, m < 0 ? 0 : (size_t)m, line + n, sizeof(line) - (size_t)n - 1);
	if (held)
		n += snprintf(line + n, sizeof(line) - (size_t)n - 1,
			      " (%u more like it held back)", held);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	if (log_syslog) {
		line[n] = 0;
		syslog(level_prio[lvl], "%s", line);
		return;
	}
	line[n++] = '\n';
	if (write(log_fd, line, (size_t)n) < 0)
		return;
}

bool log_ratelimit(long *last_sec, unsigned interval_sec)
{
	long sec = now_sec();

	if (*last_sec && sec - *last_sec < (long)interval_sec)
		return false;
	*last_sec = sec;
	return true;
}
