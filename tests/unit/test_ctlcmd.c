/*
 * test_ctlcmd.c - the control-file command parser: every good form, and a
 * fixed list of bad ones that must all be EINVAL with a reason.
 */
#include <errno.h>
#include <string.h>

#include "ctlcmd.h"
#include "test.h"

static struct fs_ctlcmd cmd;

static int parse(const char *s)
{
	const char *why = NULL;
	int ret = fs_ctlcmd_parse(s, strlen(s), &cmd, &why);

	if (ret)
		CHECK(why && why[0]);
	return ret;
}

int main(void)
{
	static const char *const bad[] = {
		"", "\n", "pin", "pin ", "pin  /a", "pin a", "pin /a/", "pin //a", "pin /a//b",
		"pin /./a", "pin /a/..", "pin /a/../b", "PIN /a", "pinn /a", "flush now",
		"flush ", "evict", "prefetch ino:", "prefetch ino:x", "prefetch ino:-1",
		"prefetch ino:0", "prefetch ino:12345678901234567890", "prefetch ino:1 ",
		"pin /a\n\n", "pin /a\nflush", "pin /a\r", "pin /a\tb", " pin /a", "unpin\t/a",
		"evict /\x7f", "scrub /", "scrub now", "scrub ",
	};
	char big[FS_CTLCMD_MAX + 16], name[300];

	CHECK_EQ(parse("flush"), 0);
	CHECK_EQ(cmd.verb, CTL_FLUSH);
	CHECK_EQ(parse("flush\n"), 0);
	CHECK_EQ(parse("scrub\n"), 0);
	CHECK_EQ(cmd.verb, CTL_SCRUB);
	CHECK(strcmp(fs_ctlverb_name(CTL_SCRUB), "scrub") == 0);
	CHECK_EQ(parse("pin /a/b.bin"), 0);
	CHECK_EQ(cmd.verb, CTL_PIN);
	CHECK(strcmp(cmd.path, "/a/b.bin") == 0);
	CHECK_EQ(cmd.ino, 0);
	CHECK_EQ(parse("unpin /a b/c d\n"), 0); /* names may hold spaces */
	CHECK(strcmp(cmd.path, "/a b/c d") == 0);
	CHECK_EQ(parse("evict /"), 0);
	CHECK(strcmp(cmd.path, "/") == 0);
	CHECK_EQ(parse("prefetch ino:42"), 0);
	CHECK_EQ(cmd.verb, CTL_PREFETCH);
	CHECK_EQ(cmd.ino, 42);
	CHECK_EQ(parse("pin /..a/.b/..."), 0); /* dots inside names are names */
	CHECK(strcmp(fs_ctlverb_name(CTL_EVICT), "evict") == 0);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (parse(bad[i]) != -EINVAL) {
			fprintf(stderr, "accepted bad command %zu: \"%s\"\n", i, bad[i]);
			return 1;
		}
	}
	/* An embedded NUL ends nothing: the whole length is parsed. */
	CHECK_EQ(fs_ctlcmd_parse("pin /a\0b", 8, &cmd, NULL), -EINVAL);
	/* Components of 255 bytes are fine, 256 are not. */
	memset(name, 'n', sizeof(name));
	snprintf(big, sizeof(big), "pin /%.255s", name);
	CHECK_EQ(parse(big), 0);
	snprintf(big, sizeof(big), "pin /%.256s", name);
	CHECK_EQ(parse(big), -EINVAL);
	/* The longest command is FS_CTLCMD_MAX bytes. */
	memset(big, 'a', sizeof(big));
	memcpy(big, "pin /", 5);
	for (size_t i = 100; i < sizeof(big); i += 100)
		big[i] = '/';
	CHECK_EQ(fs_ctlcmd_parse(big, FS_CTLCMD_MAX, &cmd, NULL), 0);
	CHECK_EQ(strlen(cmd.path), FS_CTLCMD_MAX - 4);
	CHECK_EQ(fs_ctlcmd_parse(big, FS_CTLCMD_MAX + 1, &cmd, NULL), -EINVAL);
	printf("ctlcmd: %zu bad commands refused\n", sizeof(bad) / sizeof(bad[0]));
	return 0;
}
