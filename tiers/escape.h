/*
 * escape.h - names made safe to print on a terminal or in a log line.
 *
 * Shared by the daemon's log (tiers/log.c), fsck (fs/fsck.c) and tfsctl.
 * A file name is any bytes but '/' and NUL, chosen by whoever may create
 * a file: printed raw, a newline in it forges a row of a table or a line
 * of the log, and an escape sequence acts on the reader's terminal. So
 * every byte a terminal could act on is written as \xHH: C0 controls and
 * DEL, the C1 controls (U+0080 to U+009F), the bidirectional overrides
 * that reorder what is shown, and bytes that are not UTF-8; a backslash
 * is written \\, so that an escaped name cannot be mistaken for another.
 * Printable UTF-8 passes unchanged.
 */
#ifndef TENSORFS_ESCAPE_H
#define TENSORFS_ESCAPE_H

#include <stddef.h>

/* Escape the n bytes at s into buf (len bytes, NUL-terminated); returns the length. */
size_t esc_bytes(const char *s, size_t n, char *buf, size_t len);
/* Escape the string s into buf; returns buf. NULL reads as "". */
const char *esc_name(const char *s, char *buf, size_t len);
/* The buffer that holds any escaped string of n bytes. */
#define ESC_SIZE(n) (4 * (n) + 1)

#endif
