/*
 * Unit test of the escaping of names for terminals and logs
 * (tiers/escape.c): controls, DEL, C1 controls, bidirectional overrides
 * and bytes that are not UTF-8 come out as \xHH, a backslash as \\,
 * printable UTF-8 unchanged; output that does not fit is cut between
 * characters and always terminated.
 */
#include "escape.h"
#include "test.h"

#include <string.h>

static void check(const char *in, size_t n, const char *want)
{
	char buf[256];
	size_t len = esc_bytes(in, n, buf, sizeof(buf));

	if (strcmp(buf, want) != 0) {
		fprintf(stderr, "escaped to '%s', want '%s'\n", buf, want);
		exit(1);
	}
	CHECK_EQ(len, strlen(want));
}

#define CHECK_ESC(lit, want) check(lit, sizeof(lit) - 1, want)

int main(void)
{
	char small[9];

	CHECK_ESC("plain-name_1.bin", "plain-name_1.bin");
	CHECK_ESC("a b", "a b");
	/* A newline that would forge a row, and a terminal escape. */
	CHECK_ESC("x\nfake 1 2 3", "x\\x0afake 1 2 3");
	CHECK_ESC("\033[31mred\033[0m", "\\x1b[31mred\\x1b[0m");
	CHECK_ESC("t\tr\rdel\177", "t\\x09r\\x0ddel\\x7f");
	CHECK_ESC("nul\0x", "nul\\x00x");
	CHECK_ESC("back\\slash", "back\\\\slash");
	/* Printable UTF-8 passes: e-acute, CJK, an emoji. */
	CHECK_ESC("caf\xc3\xa9 \xe5\xad\x97 \xf0\x9f\x98\x80",
		  "caf\xc3\xa9 \xe5\xad\x97 \xf0\x9f\x98\x80");
	/* C1 CSI as UTF-8 (U+009B) and raw; RLO (U+202E); LINE SEPARATOR (U+2028). */
	CHECK_ESC("\xc2\x9b"
		  "2J",
		  "\\xc2\\x9b2J");
	CHECK_ESC("\x9b"
		  "2J",
		  "\\x9b2J");
	CHECK_ESC("a\xe2\x80\xae"
		  "b",
		  "a\\xe2\\x80\\xaeb");
	CHECK_ESC("a\xe2\x80\xa8"
		  "b",
		  "a\\xe2\\x80\\xa8b");
	/* Not UTF-8: overlong '/', a surrogate, a cut sequence, a stray continuation. */
	CHECK_ESC("\xc0\xaf", "\\xc0\\xaf");
	CHECK_ESC("\xed\xa0\x80", "\\xed\\xa0\\x80");
	CHECK_ESC("ab\xe5\xad", "ab\\xe5\\xad");
	CHECK_ESC("\x80z", "\\x80z");
	/* Cut between characters, never inside an escape; always terminated. */
	CHECK_EQ(esc_bytes("abc\033def", 7, small, sizeof(small)), 8);
	CHECK(strcmp(small, "abc\\x1bd") == 0);
	CHECK_EQ(esc_bytes("ab\033", 3, small, 5), 2);
	CHECK(strcmp(small, "ab") == 0);
	CHECK(strcmp(esc_name(NULL, small, sizeof(small)), "") == 0);
	CHECK(strcmp(esc_name("\n", small, sizeof(small)), "\\x0a") == 0);
	printf("escape: ok\n");
	return 0;
}
