/*
 * fsck_report.c - the checker's report: one escaped line per problem,
 * counted, and what repair does about it; and how a record is named in
 * those lines (the path it was reached by, its kind, a hash in hex).
 *
 * Calls the lookups of fsck_load.c.
 */
#include "escape.h"
#include "fsck_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/*
 * One line of the report, after lead. Lines name files, whose names may
 * hold any byte but '/': each line is escaped whole (escape.h), so that a
 * name cannot forge a line or send a terminal escape.
 */
static void report_line(FILE *out, const char *lead, const char *fmt, va_list ap)
{
	char *msg = NULL, *buf = NULL;
	int n = vasprintf(&msg, fmt, ap);

	if (n >= 0)
		buf = malloc(ESC_SIZE((size_t)n));
	if (buf)
		esc_bytes(msg, (size_t)n, buf, ESC_SIZE((size_t)n));
	fprintf(out, "%s%s\n", lead, buf ? buf : "(out of memory)");
	free(buf);
	free(msg);
}

void fsck_report(FILE *out, const char *lead, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report_line(out, lead, fmt, ap);
	va_end(ap);
}

void fsck_problem(struct fsck *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report_line(f->out, "", fmt, ap);
	va_end(ap);
	f->problems++;
}

/* What repair does about the problem just reported; silent without --repair. */
void fsck_repaired(struct fsck *f, const char *fmt, ...)
{
	va_list ap;

	if (!f->repair)
		return;
	va_start(ap, fmt);
	report_line(f->out, "  repair: ", fmt, ap);
	va_end(ap);
}

const char *fsck_kind(const struct ck_inode *in)
{
	switch (in->rec.mode & S_IFMT) {
	case S_IFDIR:
		return "folder";
	case S_IFREG:
		return "file";
	case S_IFLNK:
		return "symlink";
	default:
		return "special file";
	}
}

#define PATH_DEPTH 256 /* deeper paths are shown from "..." on */

/* The path of a reached inode, along the names it was reached by. */
static void path_of(struct fsck *f, const struct ck_inode *in, char *buf, size_t len)
{
	struct ck_name *n = f->names.v;
	const char *parts[PATH_DEPTH];
	size_t np = 0, l = 0;

	while (in && in->ino != META_ROOT_INO && np < PATH_DEPTH) {
		parts[np++] = n[in->via].name;
		in = fsck_find_inode(f, n[in->via].parent);
	}
	buf[0] = 0;
	if (np == 0)
		snprintf(buf, len, "/");
	else if (in && in->ino != META_ROOT_INO)
		l = (size_t)snprintf(buf, len, "/...");
	while (np > 0 && l < len)
		l += (size_t)snprintf(buf + l, len - l, "/%s", parts[--np]);
}

/* "/path (ino N)" for an inode reached from the root, "inode N" otherwise. */
const char *fsck_describe(struct fsck *f, uint64_t ino, char *buf, size_t len)
{
	struct ck_inode *in = fsck_find_inode(f, ino);

	buf[0] = 0;
	if (in && in->reached) {
		path_of(f, in, buf, len);
		size_t l = strlen(buf);
		snprintf(buf + l, len - l, " (ino %" PRIu64 ")", ino);
	} else {
		snprintf(buf, len, "inode %" PRIu64, ino);
	}
	return buf;
}

void fsck_hash_hex(const uint8_t *h, char out[2 * META_HASH_LEN + 1])
{
	for (int i = 0; i < META_HASH_LEN; i++)
		sprintf(out + 2 * i, "%02x", h[i]);
}
