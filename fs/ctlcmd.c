/*
 * ctlcmd.c - parse one control command; see ctlcmd.h for the grammar.
 */
#include "ctlcmd.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static const struct {
	const char *name;
	enum fs_ctlverb verb;
	bool takes_path;
} verbs[] = {
	{"prefetch", CTL_PREFETCH, true}, {"pin", CTL_PIN, true}, {"unpin", CTL_UNPIN, true},
	{"evict", CTL_EVICT, true},	  {"flush", CTL_FLUSH, false}, {"scrub", CTL_SCRUB, false},
};

#define N_VERBS (sizeof(verbs) / sizeof(verbs[0]))

const char *fs_ctlverb_name(enum fs_ctlverb v)
{
	for (size_t i = 0; i < N_VERBS; i++)
		if (verbs[i].verb == v)
			return verbs[i].name;
	return "?";
}

static int fail(const char **why, const char *reason)
{
	if (why)
		*why = reason;
	return -EINVAL;
}

/* ino:N with N a decimal number of 1 to 19 digits and no sign or space. */
static int parse_ino(const char *s, size_t n, uint64_t *ino, const char **why)
{
	uint64_t v = 0;

	if (n == 0 || n > 19)
		return fail(why, "inode number must have 1 to 19 digits");
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return fail(why, "inode number must be decimal digits");
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v == 0)
		return fail(why, "inode number 0 does not exist");
	*ino = v;
	return 0;
}

static int check_path(const char *p, size_t n, const char **why)
{
	if (n == 0 || p[0] != '/')
		return fail(why, "path must be absolute from the mount's root, or ino:N");
	if (n == 1)
		return 0;
	if (p[n - 1] == '/')
		return fail(why, "path must not end with '/'");
	for (size_t i = 1, start = 1; i <= n; i++) {
		if (i < n && p[i] != '/')
			continue;
		size_t len = i - start;

		if (len == 0)
			return fail(why, "path has an empty component");
		if (len > 255)
			return fail(why, "path component longer than 255 bytes");
		if ((len == 1 && p[start] == '.') ||
		    (len == 2 && p[start] == '.' && p[start + 1] == '.'))
			return fail(why, "path must not contain '.' or '..'");
		start = i + 1;
	}
	return 0;
}

int fs_ctlcmd_parse(const char *buf, size_t len, struct fs_ctlcmd *out, const char **why)
{
	size_t vlen, i;

	memset(out, 0, sizeof(*out) - sizeof(out->path));
	out->path[0] = 0;
	if (len > FS_CTLCMD_MAX)
		return fail(why, "command longer than 4096 bytes");
	if (len && buf[len - 1] == '\n')
		len--;
	if (len == 0)
		return fail(why, "empty command");
	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)buf[i];

		if (c == 0)
			return fail(why, "NUL byte in command");
		if (c == '\n' || c == '\r')
			return fail(why, "one command per write");
		if (c < 0x20 || c == 0x7f)
			return fail(why, "control character in command");
	}
	for (vlen = 0; vlen < len && buf[vlen] != ' '; vlen++)
		;
	for (i = 0; i < N_VERBS; i++)
		if (strlen(verbs[i].name) == vlen && memcmp(verbs[i].name, buf, vlen) == 0)
			break;
	if (i == N_VERBS)
		return fail(why, "unknown command (prefetch, pin, unpin, evict, flush, scrub)");
	out->verb = verbs[i].verb;
	if (!verbs[i].takes_path)
		return vlen == len ? 0 : fail(why, "command takes no argument");
	if (vlen == len || vlen + 1 == len)
		return fail(why, "command needs a PATH or ino:N");

	/* Exactly one space, then the argument; it may contain spaces itself. */
	const char *arg = buf + vlen + 1;
	size_t alen = len - vlen - 1;

	if (arg[0] == ' ')
		return fail(why, "one space between command and argument");
	if (alen > 4 && memcmp(arg, "ino:", 4) == 0)
		return parse_ino(arg + 4, alen - 4, &out->ino, why);
	if (check_path(arg, alen, why))
		return -EINVAL;
	memcpy(out->path, arg, alen);
	out->path[alen] = 0;
	return 0;
}
