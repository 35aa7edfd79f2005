/*
 * log.h - the daemon's log: one line per event, to stderr, a file or
 * syslog.
 *
 * Shared by fs/ and tiers/. Messages carry a level; those above the
 * configured level are dropped. Errors and warnings of one format are
 * held to a few lines a second, and the next line says how many were
 * held back; call sites that fail per request also use log_ratelimit.
 */
#ifndef TENSORFS_LOG_H
#define TENSORFS_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_LVL_ERR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG };

void log_set_level(enum log_level lvl);
/* Send the log to this already open stream's file descriptor. */
void log_set_fd(int fd);
/* Send the log to syslog(3), facility daemon, from now on. */
void log_use_syslog(void);
void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* At most one line per interval for this call site's counter. */
bool log_ratelimit(long *last_sec, unsigned interval_sec);

#define log_err(...) log_msg(LOG_LVL_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
