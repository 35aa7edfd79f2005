/*
 * fuzz_ctlcmd.c - libFuzzer target: commands written to /.tensorfs/ctl.
 *
 * Any bytes go to fs_ctlcmd_parse. Besides crashes, it checks the grammar's
 * promises (fs/ctlcmd.h): a command is accepted or refused with a reason;
 * an accepted one has a known verb, and a path that is absolute, NUL-free,
 * without empty, "." or ".." components, or else an inode number (flush
 * and scrub take neither); and parsing the same bytes twice gives the
 * same result.
 */
#include "ctlcmd.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_path(const char *p)
{
	size_t n = strlen(p);

	if (p[0] != '/' || (n > 1 && p[n - 1] == '/') || strstr(p, "//"))
		abort();
	for (const char *c = p; c; c = strchr(c + 1, '/')) {
		if (!strncmp(c, "/./", 3) || !strcmp(c, "/.") || !strncmp(c, "/../", 4) ||
		    !strcmp(c, "/.."))
			abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct fs_ctlcmd a, b;
	const char *why = NULL, *why2 = NULL;
	char *buf = malloc(size ? size : 1);
	int ret, ret2;

	if (!buf)
		return 0;
	memcpy(buf, data, size); /* exactly size bytes: an over-read is caught */
	ret = fs_ctlcmd_parse(buf, size, &a, &why);
	ret2 = fs_ctlcmd_parse(buf, size, &b, &why2);
	if (ret != ret2 || (ret != 0 && ret != -EINVAL))
		abort();
	if (ret) {
		if (!why || !*why)
			abort();
		free(buf);
		return 0;
	}
	if (size > FS_CTLCMD_MAX || a.verb != b.verb || a.ino != b.ino || strcmp(a.path, b.path))
		abort();
	if (strcmp(fs_ctlverb_name(a.verb), "?") == 0)
		abort();
	if (a.verb == CTL_FLUSH || a.verb == CTL_SCRUB) {
		if (a.ino || a.path[0]) /* they take no PATH */
			abort();
	} else if (!a.ino) {
		check_path(a.path);
	}
	free(buf);
	return 0;
}
