/*
 * msg.c - tfsctl's name in its messages ("tfsctl", or "tfsctl COMMAND"
 * once main.c knows the command) and the message on stderr that every
 * part of it prints through errmsg. Calls only escape.h: the commands
 * (main.c, mount.c, stats.c, where.c, unmount.c) call it.
 */
#include "tfsctl.h"
#include "escape.h"

#include <stdarg.h>
#include <stdio.h>

const char *prog = "tfsctl";

/* Messages name paths, which may hold any byte: escaped whole (escape.h). */
void errmsg(const char *fmt, ...)
{
	char msg[2 * PATH_MAX], out[ESC_SIZE(sizeof(msg))];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(msg) - 1)
		n = (int)sizeof(msg) - 1;
	esc_bytes(msg, n < 0 ? 0 : (size_t)n, out, sizeof(out));
	fprintf(stderr, "%s: %s\n", prog, out);
}
